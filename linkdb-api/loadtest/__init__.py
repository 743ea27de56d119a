"""``make bench-api``: the LinkDB API's hot queries under a fixed open-loop load."""
