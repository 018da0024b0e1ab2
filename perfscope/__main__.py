from perfscope.cli import main

main()
