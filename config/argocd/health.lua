-- Argo CD health check for iteron.dev/ImplementationActivation.
--
-- Install it as the argocd-cm key
--   resource.customizations.health.iteron.dev_ImplementationActivation
-- (config/argocd/argocd-cm.yaml carries this file verbatim; see README.md).
--
-- Precedence: the first rule that matches decides.
--   1. spec.paused is true                      -> Suspended
--        The manager does not act on spec changes, whatever the conditions say:
--        the one thing a reader must know first is that nothing will move.
--   2. no status yet, or
--      status.observedGeneration < metadata.generation -> Progressing
--        The conditions describe an older spec. A new spec may already cure a
--        Stalled one, so conditions are read only once the spec was observed.
--   3. Stalled=True                             -> Degraded (Stalled's message)
--        Before Reconciling: a stalled activation that also reports Reconciling
--        will still not progress without a change (a new spec or the
--        iteron.dev/retry annotation), so waiting on it would wait forever.
--   4. Degraded=True                            -> Degraded (Degraded's message)
--        Part of a plan moved and part did not, or a module is not serving: the
--        service is impaired now, even while the manager works on it.
--   5. Reconciling=True                         -> Progressing (Reconciling's message)
--        A plan or a transaction (a hot swap) is in progress.
--   6. Ready=True                               -> Healthy
--   7. Ready=False                              -> Degraded (Ready's message)
--   8. anything else (Ready Unknown or absent)  -> Progressing
-- A message is the condition's message, or its reason when the message is empty.
--
-- Argo CD itself reports an object with a deletionTimestamp as Progressing
-- ("Pending deletion") before it runs this script, so deletion is not handled here.
--
-- Only Lua's base library and the `obj` table are used: Argo CD opens the
-- string, math and io libraries only with resource.customizations.useOpenLibs.

local function condition(conditions, kind)
  for _, c in ipairs(conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function explain(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  if c ~= nil and c.reason ~= nil and c.reason ~= "" then
    return c.reason
  end
  return fallback
end

local hs = {}

if obj.spec ~= nil and obj.spec.paused == true then
  hs.status = "Suspended"
  hs.message = "Paused: spec changes are not acted on; running providers keep serving"
  return hs
end

local node = "its node"
if obj.spec ~= nil and obj.spec.nodeName ~= nil then
  node = "node " .. obj.spec.nodeName
end

local generation = obj.metadata.generation
local observed = 0
if obj.status ~= nil and obj.status.observedGeneration ~= nil then
  observed = obj.status.observedGeneration
end
if obj.status == nil or (generation ~= nil and observed < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the manager of " .. node .. " to observe generation " ..
    tostring(generation) .. " (status describes generation " .. tostring(observed) .. ")"
  return hs
end

local conditions = {}
if obj.status.conditions ~= nil then
  conditions = obj.status.conditions
end

local stalled = condition(conditions, "Stalled")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = explain(stalled, "Stalled")
  return hs
end

local degraded = condition(conditions, "Degraded")
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = explain(degraded, "Degraded")
  return hs
end

local reconciling = condition(conditions, "Reconciling")
if reconciling ~= nil and reconciling.status == "True" then
  hs.status = "Progressing"
  hs.message = explain(reconciling, "Reconciling")
  return hs
end

local ready = condition(conditions, "Ready")
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = explain(ready, "Ready")
  return hs
end
if ready ~= nil and ready.status == "False" then
  hs.status = "Degraded"
  hs.message = explain(ready, "Not ready")
  return hs
end

hs.status = "Progressing"
hs.message = explain(ready, "Waiting for the manager of " .. node .. " to report Ready")
return hs
