"""Deploying the speech server on many GPUs: Ray Serve (``pipecat_veena.deploy.ray``).

``replica_args`` holds what one replica is given (checkpoint, engine and server settings); it
imports no Ray, so a config can be checked anywhere. The Kubernetes recipe (plain replicas of
``pipecat-veena serve``) is in ``examples/k8s/``.
"""
