// Tag endpoints through the official e2b SDK: assign, list, resolve, remove.
// Prints one JSON line for tags_test.go.
const { Template } = await import(process.env.E2B_MODULE)
const name = process.env.TEMPLATE_NAME
const out = {}
// Builtins are the operator's: a team tags a template of its own.
await Template.build(Template().fromTemplate('base').runCmd('true'), name)
try {
  await Template.assignTags('base:default', 'e2e-mine')
} catch (e) {
  out.builtinError = `${e.constructor.name}: ${e.message}`
}
out.assigned = await Template.assignTags(`${name}:default`, ['e2e-stable', 'e2e-canary'])
out.listed = (await Template.getTags(name)).map(t => ({ tag: t.tag, buildId: t.buildId }))
out.exists = await Template.exists(`${name}:e2e-stable`)
await Template.removeTags(name, 'e2e-canary')
out.afterRemove = (await Template.getTags(name)).map(t => t.tag).sort()
try {
  await Template.assignTags('no-such-template:v1', 'x')
} catch (e) {
  out.unknownError = `${e.constructor.name}: ${e.message}`
}
console.log(JSON.stringify(out))
