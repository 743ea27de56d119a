import sys

from polycorn_chaos.campaign import main

sys.exit(main())
