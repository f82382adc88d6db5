"""Physical plans: typed DAGs of nodes with named ports, serializable across processes."""
