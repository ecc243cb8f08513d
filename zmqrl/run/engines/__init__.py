"""Engines that run a topology's node processes somewhere other than this machine.

``zmqrl up`` runs every node on this machine (:mod:`zmqrl.run.launch`). ``zmqrl up --engine
ray`` places them on a Ray cluster (:mod:`zmqrl.run.engines.ray_supervisor`): each node
replica is still the ordinary ``zmqrl node`` process, started and watched by a small Ray
actor on the host Ray chose, and the data still travels on ZeroMQ. Ray is an optional
dependency (``pip install 'zmqrl[ray]'``); nothing here imports it at module level
except the Ray modules themselves.
"""
