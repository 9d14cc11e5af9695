from sentinel.cli import main

main()
