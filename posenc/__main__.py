from posenc.cli import main

main()
