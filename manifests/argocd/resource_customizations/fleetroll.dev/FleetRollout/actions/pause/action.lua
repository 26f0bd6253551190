-- Holds the rollout before its next batch (spec.paused); the batch in flight finishes.
obj.spec.paused = true
return obj
