-- Approves the batch the rollout waits for, bound to the plan and the gates it was shown with
-- (status.pendingApproval): if either changes, the operator ignores this approval and asks again. An
-- approval already given for that batch, plan and gates is left as it is (with whoever gave it); older
-- ones for the batch are replaced.
local pending = nil
if type(obj.status) == "table" and type(obj.status.pendingApproval) == "table" then
  pending = obj.status.pendingApproval
end
if pending == nil or pending.batch == nil or pending.planHash == nil or pending.gatesHash == nil then
  error("no batch of this rollout is waiting for approval")
end
if type(obj.spec) ~= "table" then
  error("the rollout has no spec")
end
local approvals = {}
if type(obj.spec.approvals) == "table" then
  for _, a in ipairs(obj.spec.approvals) do
    if a.batch == pending.batch and a.planHash == pending.planHash and a.gatesHash == pending.gatesHash then
      return obj
    end
    if a.batch ~= pending.batch then
      table.insert(approvals, a)
    end
  end
end
table.insert(approvals, { batch = pending.batch, planHash = pending.planHash, gatesHash = pending.gatesHash })
obj.spec.approvals = approvals
return obj
