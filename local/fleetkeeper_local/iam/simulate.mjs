// The IAM evaluator process: @cloud-copilot/iam-simulate behind JSON lines on stdin/stdout.
//
// A development tool only (AGPL-3.0, see docs/dependencies.md): the local stack and the tests start it,
// nothing ships it. Python (fleetkeeper_local/iam/evaluator.py) sends one JSON object a line:
//   {"op": "policies", "id": K, "identity": [{"name", "policy"}], "resource": {NAME: policy}}
//     keeps a set of policies under K (a policy set is sent once, then named by requests);
//   {"op": "evaluate", "seq": N, "policies": K, "identity": [NAMES] | null, "resourcePolicy": NAME | null,
//    "principal", "action", "resource", "account", "context": {...}}
//     answers {"seq": N, "result": "Allowed" | "ImplicitlyDenied" | "ExplicitlyDenied" | "Error", ...}.
import { createInterface } from 'node:readline'
import {
  getDenialReasons,
  getGrantReasons,
  runSimulation,
  runUnsafeSimulation
} from '@cloud-copilot/iam-simulate'

const policySets = new Map()

function analysisOf(response) {
  if (response.resultType === 'single') return response.result
  // A created resource (`instance/*`): the exact pattern decides; a narrower one may only deny more.
  const results = response.results ?? []
  return results.find((r) => r.analysis.result !== 'Allowed') ?? results[0]
}

async function evaluate(message) {
  const set = policySets.get(message.policies)
  if (!set) return { result: 'Error', error: `unknown policy set ${message.policies}` }
  const identity = message.identity
    ? set.identity.filter((p) => message.identity.includes(p.name))
    : set.identity
  const simulation = {
    request: {
      principal: message.principal,
      action: message.action,
      resource: { resource: message.resource, accountId: message.account },
      contextVariables: message.context ?? {}
    },
    identityPolicies: identity,
    serviceControlPolicies: [],
    resourceControlPolicies: []
  }
  if (message.resourcePolicy) simulation.resourcePolicy = set.resource[message.resourcePolicy]
  const response = await runSimulation(simulation, {})
  if (response.resultType === 'error') {
    // The reference's ARN patterns want an account, but a document AWS owns has none in its ARN
    // (arn:aws:ssm:<region>::document/AWS-RunShellScript): evaluate it without the resource-type
    // validation, by the same engine, which then gives no reasons.
    const account = message.resource.split(':')[4]
    if (response.errors.message === 'no.resource.types' && account === '') {
      return { result: runUnsafeSimulation(simulation, {}), ignored: [] }
    }
    return { result: 'Error', error: JSON.stringify(response.errors) }
  }
  const found = analysisOf(response)
  const answer = { result: response.overallResult, ignored: found?.ignoredContextKeys ?? [] }
  if (!found) return answer
  if (response.overallResult === 'Allowed') {
    answer.grants = getGrantReasons(found.analysis)
  } else {
    answer.denials = getDenialReasons(found.analysis)
  }
  return answer
}

const lines = createInterface({ input: process.stdin, crlfDelay: Infinity })
for await (const line of lines) {
  if (!line.trim()) continue
  let message
  try {
    message = JSON.parse(line)
  } catch (error) {
    process.stdout.write(JSON.stringify({ seq: null, result: 'Error', error: String(error) }) + '\n')
    continue
  }
  if (message.op === 'policies') {
    policySets.set(message.id, { identity: message.identity, resource: message.resource ?? {} })
    continue
  }
  let answer
  try {
    answer = await evaluate(message)
  } catch (error) {
    answer = { result: 'Error', error: String(error?.stack ?? error) }
  }
  process.stdout.write(JSON.stringify({ seq: message.seq, ...answer }) + '\n')
}
