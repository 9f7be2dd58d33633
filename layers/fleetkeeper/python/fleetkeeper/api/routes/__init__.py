"""The admin API's routes, one Powertools Router per resource."""
