-- Approves the batch the rollout waits for, bound to the plan it was shown with (status.pendingApproval):
-- if the plan changes, the operator ignores this approval and asks again.
local pending = obj.status ~= nil and obj.status.pendingApproval or nil
if pending == nil then
  error("no batch of this rollout is waiting for approval")
end
local approvals = {}
if obj.spec.approvals ~= nil then
  for _, a in ipairs(obj.spec.approvals) do
    if a.batch ~= pending.batch then
      table.insert(approvals, a)
    end
  end
end
table.insert(approvals, { batch = pending.batch, planHash = pending.planHash })
obj.spec.approvals = approvals
return obj
