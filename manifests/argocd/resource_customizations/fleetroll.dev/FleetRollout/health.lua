-- Argo CD health of a fleetroll.dev FleetRollout, from its phase and the conditions the operator writes.
-- Uses only the base and table libraries, so it runs from argocd-cm without useOpenLibs. Argo CD reports
-- Missing itself when the object does not exist; this script never runs then.
local hs = {}

local function field(t, key)
  if type(t) == "table" then
    return t[key]
  end
  return nil
end

local function text(v)
  if type(v) == "string" then
    return v
  end
  return ""
end

local function condition(status, type_)
  local conditions = field(status, "conditions")
  if type(conditions) ~= "table" then
    return nil
  end
  for _, c in ipairs(conditions) do
    if field(c, "type") == type_ then
      return c
    end
  end
  return nil
end

local function is_true(c)
  return field(c, "status") == "True"
end

local status = field(obj, "status")
if type(status) ~= "table" then
  hs.status = "Progressing"
  hs.message = "Waiting for the fleetroll operator to see the rollout"
  return hs
end

local generation = tonumber(field(field(obj, "metadata"), "generation"))
local observed = tonumber(field(status, "observedGeneration")) or 0
if generation ~= nil and observed < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the fleetroll operator to observe generation " .. tostring(generation)
  return hs
end

local message = text(field(status, "message"))
local phase = field(status, "phase")
-- Stalled says the rollout stopped short: a spec the operator cannot act on, a pause the failure budget
-- forced, or a succeeded rollout whose targets someone else changed since. Operators too old to write it
-- have only Degraded, which is also True while a failure-policy rollback runs (not stalled then).
local stalled = condition(status, "Stalled")
if stalled == nil and phase ~= "RollingBack" then
  stalled = condition(status, "Degraded")
end

if phase == "Failed" or phase == "Aborted" or phase == "RolledBack" then
  hs.status = "Degraded"
elseif is_true(stalled) then
  hs.status = "Degraded"
  local why, detail = text(field(stalled, "reason")), text(field(stalled, "message"))
  if why ~= "" and detail ~= "" then
    message = why .. ": " .. detail
  elseif detail ~= "" then
    message = detail
  end
elseif phase == "Succeeded" then
  hs.status = "Healthy"
elseif phase == "Paused" or phase == "WaitingForApproval" then
  hs.status = "Suspended"
else
  -- Pending (being planned), Progressing, RollingBack.
  hs.status = "Progressing"
end
hs.message = message
return hs
