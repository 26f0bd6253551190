-- Lets a paused rollout go on with its next batch. A rollout its metric analysis holds (a metric
-- inconclusive, or failed under onFailure Pause) goes on once spec.resumeToken changes: the token written
-- here names the hold it releases, so the same action applied twice releases nothing more.
obj.spec.paused = false
local status = obj.status
if type(status) == "table" and type(status.batches) == "table" then
  for _, b in ipairs(status.batches) do
    if type(b) == "table" and b.index == status.currentBatch and type(b.analysis) == "table"
      and type(b.analysis.hold) == "table" and type(b.analysis.hold.since) == "string" then
      obj.spec.resumeToken = "argocd/" .. b.analysis.hold.since
    end
  end
end
return obj
