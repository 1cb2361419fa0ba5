"""What posenc shows people: its rich consoles and log handler (``terminal``), every PNG it writes
(``figures``), and the commands it prints for people to paste (``commands``)."""
