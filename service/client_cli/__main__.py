"""`python -m service.client_cli`: the `nvcf` console script."""

from service.client_cli.app import main

main()
