"""Accounts as the operator manages them (NVCF's `account_setup` routes): their limits, their
suspension and their deletion."""
