-- Argo CD health check for iteron.dev/ActivationSet.
--
-- Install it as the argocd-cm key
--   resource.customizations.health.iteron.dev_ActivationSet
-- (config/argocd/argocd-cm.yaml carries this file verbatim; see README.md).
--
-- Precedence: the first rule that matches decides.
--   1. spec.paused is true                       -> Suspended
--        No node is moved, whatever the conditions say.
--      status.phase is PausedAtStep               -> Suspended
--        The rollout waits at a pause step for kubectl iteron rollout promote.
--   2. no status yet                             -> Progressing
--   3. Stalled=True for this generation          -> Degraded (Stalled's message)
--        The rollout halted, reverted, failed to revert, or cannot stamp a
--        node: it does not move without a person (resume, undo, a new template).
--   4. Reconciling=True for this generation      -> Progressing (Reconciling's message)
--        Waves are moving, the canaries soak, or a revert moves nodes back.
--   5. status.observedGeneration < metadata.generation, or conditions of an
--      older generation                          -> Progressing
--        The fleet controller has not acted on this spec yet (a Stalled of the
--        old template must not make a new one look Degraded).
--   6. Ready=True                                -> Healthy
--        Every selected node is Ready on the template's revision.
--   7. Ready=False                               -> Degraded (Ready's message)
--   8. anything else                             -> Progressing
-- A message is the condition's message, or its reason when the message is empty.
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
  hs.message = "Paused: no node is moved to another revision; new nodes get the stable one"
  return hs
end

if obj.status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the fleet controller to observe the set"
  return hs
end

if obj.status.phase == "PausedAtStep" then
  hs.status = "Suspended"
  hs.message = "Paused at a step of the rollout: kubectl iteron rollout promote goes on"
  if obj.status.conditions ~= nil then
    for _, c in ipairs(obj.status.conditions) do
      if c.type == "Ready" and c.message ~= nil and c.message ~= "" then
        hs.message = c.message
      end
    end
  end
  return hs
end

local generation = obj.metadata.generation
local conditions = {}
if obj.status.conditions ~= nil then
  conditions = obj.status.conditions
end

local function current(c)
  return c ~= nil and (generation == nil or c.observedGeneration == generation)
end

local stalled = condition(conditions, "Stalled")
if current(stalled) and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = explain(stalled, "Stalled")
  return hs
end

local reconciling = condition(conditions, "Reconciling")
if current(reconciling) and reconciling.status == "True" then
  hs.status = "Progressing"
  hs.message = explain(reconciling, "Reconciling")
  return hs
end

local observed = 0
if obj.status.observedGeneration ~= nil then
  observed = obj.status.observedGeneration
end
local ready = condition(conditions, "Ready")
if (generation ~= nil and observed < generation) or (ready ~= nil and not current(ready)) then
  hs.status = "Progressing"
  hs.message = "Waiting for the fleet controller to act on generation " .. tostring(generation) ..
    " (status describes generation " .. tostring(observed) .. ")"
  return hs
end

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
hs.message = explain(ready, "Waiting for the fleet controller")
return hs
