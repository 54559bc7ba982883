"""The names the sweeper, its jobs and zoo-sweep-report share: the environment a job learns its
trial from, and the user attributes the sweeper writes into an Optuna study and its trials. Defined
here once; the report reads what the sweeper wrote by these same names."""

# How a job learns that it is an Optuna trial: callbacks.TrialOfTheJob sets these in the job's process
# (from the sweep directory's RESULTS and the job's number), and the DDP processes Lightning starts from
# the job inherit them (and zoo-train's tasks.errors.RAISE_ERRORS_ENV, its side of the contract).
STORAGE_ENV, STUDY_ENV, TRIAL_ENV = "ZOO_OPTUNA_STORAGE", "ZOO_OPTUNA_STUDY", "ZOO_OPTUNA_TRIAL"

RESULTS = "optimization_results.yaml"  # in the sweep directory: the study it belongs to, its best trial, counts

# Trial attributes
JOB_DIR = "job_dir"  # the job's output directory (logs/metrics.csv, checkpoints/)
ERROR = "error"  # why a trial failed: "<ExceptionType>: <message>", at most 1000 characters
RETRY_OF = "zoo_retry_of"  # on a trial queued again: the number of the interrupted trial it retries
OWNER = "zoo_sweeper"  # "host:pid" of the sweep process that asked for the trial

# Study attributes
INTERRUPTED = "zoo_interrupted"  # numbers of trials a killed sweep left behind (not counted)
PRUNER = "zoo_pruner"  # {"name": ..., "args": ...}: the pruner, so that jobs build the same one
