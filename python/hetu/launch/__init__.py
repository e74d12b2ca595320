"""heturun: start a hetu job (scheduler, servers, workers) from a cluster file.

    python python/runner.py -c examples/config/local.yml python examples/ctr/run_hetu.py ...
    python python/runner.py -w 2 -s 1 python examples/ctr/run_hetu.py ...

Scheduler and servers run as ``python -m hetu.launcher`` (locally as child processes, on other
hosts over ssh); all workers run under one ``mpirun`` so that mpi4py's COMM_WORLD spans them and
the worker id equals the MPI rank. Every output line is tagged with role and rank. The first
process that fails ends the whole job, and the exit message names it; a launcher that dies takes
its job with it (guard.py). Workers of a host with `gpus: N` in the cluster file (or --gpus N
with -w) get HETU_GPUS=N, from which hetu.dist.devices picks each worker's GPU.

Exit status: 0 all workers succeeded and the servers shut down; 1 a process failed (or servers
did not shut down in time, or no worker completed a step for --stall-timeout seconds); 2 bad
usage or cluster file; 124 the --timeout elapsed; 128+signal when interrupted.

Modules: cluster (the cluster file, hosts), ssh (remote command lines), processes (children and
their output), mpirun (the workers' mpirun), guard (launcher death), leftovers (Open MPI's files
of a job), progress (a worker's step reports), watchdog (the launcher's stall watch), job (one
job's supervision), cli (the command line).
"""
