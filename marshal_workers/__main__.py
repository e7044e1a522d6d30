from marshal_workers.cli import main

main()
