"""Building blocks: typed heads and boxes, families, model loading, trace templates, interventions and the execution
backends. Imports nothing above it."""
