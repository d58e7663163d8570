"""`python -m nms` is `nms`."""

from nms.app.cli import main

main()
