-- Restores every target the rollout changed to the image it had before, once each.
obj.spec.rollback = true
return obj
