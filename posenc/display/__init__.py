"""What posenc shows people, shared by every command: its rich consoles and log handler
(``terminal``), every PNG it writes (``figures``), and the commands it prints for people to paste
(``commands``)."""
