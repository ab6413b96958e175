from ait.cli import main

main()
