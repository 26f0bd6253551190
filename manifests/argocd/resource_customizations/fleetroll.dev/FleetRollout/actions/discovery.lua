-- The actions Argo CD offers on a FleetRollout, each only where it applies. Each is a spec change the
-- operator acts on, the same controls kubectl fleetroll and the MCP tools use; the admission policy
-- judges who sends them.
local function field(t, key)
  if type(t) == "table" then
    return t[key]
  end
  return nil
end

local actions = {}
local spec = field(obj, "spec")
local status = field(obj, "status")
local phase = field(status, "phase") or "Pending"
local finished = phase == "Succeeded" or phase == "Failed" or phase == "Aborted" or phase == "RolledBack"
local rolling_back = phase == "RollingBack" or phase == "RolledBack" or field(spec, "rollback") == true
local updated = tonumber(field(field(status, "counts"), "updated")) or 0
-- A hold of the metric analysis (AnalysisInconclusive, AnalysisFailed) waits for a resume too.
local reason = field(status, "reason")
local held = phase == "Paused" and (reason == "AnalysisInconclusive" or reason == "AnalysisFailed")

actions["pause"] = {
  ["iconClass"] = "fa fa-fw fa-pause-circle",
  ["disabled"] = field(spec, "paused") == true or finished or rolling_back or field(spec, "abort") == true,
}
actions["resume"] = {
  ["iconClass"] = "fa fa-fw fa-play-circle",
  ["disabled"] = (field(spec, "paused") ~= true and not held) or finished,
}
actions["approve"] = {
  ["iconClass"] = "fa fa-fw fa-check-circle",
  ["disabled"] = phase ~= "WaitingForApproval" or type(field(status, "pendingApproval")) ~= "table",
}
actions["abort"] = {
  ["iconClass"] = "fa fa-fw fa-stop-circle",
  ["disabled"] = finished or rolling_back or field(spec, "abort") == true,
}
-- Only a rollout that changed something has anything to restore.
actions["rollback"] = {
  ["iconClass"] = "fa fa-fw fa-undo",
  ["disabled"] = rolling_back or updated == 0,
}
return actions
