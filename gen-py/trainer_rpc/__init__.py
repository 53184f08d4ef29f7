__all__ = ['ttypes', 'constants', 'ComputeNode', 'Coordinator']
