"""`python -m gateway`: serve with settings from the environment."""

from gateway.main import main

main()
