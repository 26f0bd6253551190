-- The actions Argo CD offers on a FleetRollout. Each is a spec change the operator acts on, the same
-- controls kubectl fleetroll and the MCP tools use; the admission policy judges who sends them.
local actions = {}
local spec = obj.spec or {}
local status = obj.status or {}
local phase = status.phase or "Pending"
local finished = phase == "Succeeded" or phase == "Failed" or phase == "Aborted" or phase == "RolledBack"
local rolling_back = phase == "RollingBack" or phase == "RolledBack" or spec.rollback == true

actions["pause"] = {
  ["iconClass"] = "fa fa-fw fa-pause-circle",
  ["disabled"] = spec.paused == true or finished or rolling_back or spec.abort == true,
}
actions["resume"] = {
  ["iconClass"] = "fa fa-fw fa-play-circle",
  ["disabled"] = spec.paused ~= true,
}
actions["approve"] = {
  ["iconClass"] = "fa fa-fw fa-check-circle",
  ["disabled"] = phase ~= "WaitingForApproval" or status.pendingApproval == nil,
}
actions["abort"] = {
  ["iconClass"] = "fa fa-fw fa-stop-circle",
  ["disabled"] = finished or rolling_back or spec.abort == true,
}
actions["rollback"] = {
  ["iconClass"] = "fa fa-fw fa-undo",
  ["disabled"] = rolling_back,
}
return actions
