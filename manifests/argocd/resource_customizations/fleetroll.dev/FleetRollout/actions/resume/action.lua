-- Lets a paused rollout go on with its next batch.
obj.spec.paused = false
return obj
