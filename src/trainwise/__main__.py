from trainwise.cli import main

main()
