from overlapcheck.cli import main

main()
