"""DynamoDB access: the table schema, keys, conditional writes, transactions and queries."""
