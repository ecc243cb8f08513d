"""The bus: the wire (framing, message declarations), sockets, addresses, CURVE/ZAP, a
topology as plain data (``spec``), and the node runtime every node process is built on
(its lifetime, metrics, status, TensorBoard scalars, core pinning).

The bottom layer: it imports nothing from ``zmqrl.parts`` or ``zmqrl.run``.
"""
