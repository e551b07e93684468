"""SLURM, in one place: ``job`` reads the allocation from the environment and decides the etcd
layout (pure but for one ``scontrol`` call), ``defaults`` takes elastic-run's options the user did not
give from the job, ``allocation`` runs this node's etcd member of the job's own cluster."""
