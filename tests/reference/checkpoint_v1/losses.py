"""Custom loss of the checkpoint fixture's ``custom`` query (imported by the pipeline config)."""


def huber_dep_arr():
    """Huber regression of arr_delay on dep_delay, both noised, threshold 10 minutes."""
    from mechanisms.losses import HuberLoss

    return HuberLoss(c=10.0, noised=(0, 1))
