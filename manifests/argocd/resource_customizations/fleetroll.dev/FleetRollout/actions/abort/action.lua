-- Stops the rollout where it stands: no further batch starts; targets already changed keep their image.
obj.spec.abort = true
return obj
