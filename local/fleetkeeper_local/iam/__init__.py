"""Every AWS request a function makes, evaluated against the IAM policies the function deploys with.

attribution.py says which function makes a request; requests.py what AWS authorizes for it;
policies.py reads the functions' policies from the synthesized dev stage; evaluator.py runs a real IAM
evaluator; recorder.py ties them to botocore; record.py keeps what became of each request; session.py
turns it on for a process.
"""

from fleetkeeper_local.iam.attribution import FUNCTIONS, acting_as, as_function

__all__ = ["FUNCTIONS", "acting_as", "as_function"]
