"""Running physical plans: the runner, the relational operators, results, reports and explain."""
