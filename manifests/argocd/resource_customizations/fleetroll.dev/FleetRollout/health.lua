-- Argo CD health of a fleetroll.dev FleetRollout, from its phase and the conditions the operator writes.
-- Uses only the base and table libraries, so it runs from argocd-cm without useOpenLibs.
local hs = {}

local function condition(status, type)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == type then
      return c
    end
  end
  return nil
end

local function is_true(status, type)
  local c = condition(status, type)
  return c ~= nil and c.status == "True"
end

local status = obj.status
if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the fleetroll operator to see the rollout"
  return hs
end

local generation = obj.metadata.generation
if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the fleetroll operator to observe generation " .. tostring(generation)
  return hs
end

local message = status.message or ""
local phase = status.phase

if phase == "Failed" or phase == "Aborted" or phase == "RolledBack" then
  hs.status = "Degraded"
elseif is_true(status, "Stalled") or is_true(status, "Degraded") then
  -- A pause the failure budget forced, a spec the operator cannot act on, or a succeeded rollout whose
  -- targets someone else changed since: the reason says which.
  hs.status = "Degraded"
  local c = condition(status, "Stalled")
  if c == nil or c.status ~= "True" then
    c = condition(status, "Degraded")
  end
  if c.message ~= nil and c.message ~= "" then
    message = tostring(c.reason) .. ": " .. tostring(c.message)
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
