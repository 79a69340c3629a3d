"""Parts of the Accelerator facade, split by concern (collectives, saving, observing).

Each part is a mixin that only reads the attributes ``Accelerator.__init__`` sets; none makes a
backend decision (those belong to the connector and the strategies).
"""
