// The TypeScript SDK's own methods against our server: the four generation calls, Initialize with
// an env, every RPC the SDK shares with the Box proto, and the later-only ones we serve. Run by
// tools/ts_sdk_check.py with A3S_ADDRESS (our server), A3S_TS_SDK_DIR (the built SDK) and
// A3S_CHECK_WORKSPACE (a directory inside the server's workspace root). Prints one line per check:
// `CHECK {"name", "ok", "reason"}`.
import { pathToFileURL } from 'node:url';
import { join } from 'node:path';

const sdk = await import(pathToFileURL(join(process.env.A3S_TS_SDK_DIR, 'dist', 'index.js')).href);
const client = new sdk.A3sClient({ address: process.env.A3S_ADDRESS });
const workspace = process.env.A3S_CHECK_WORKSPACE;
const STEP_MS = 20000;

function report(name, ok, reason = '') {
  console.log('CHECK ' + JSON.stringify({ name, ok, reason }));
}

function expect(condition, what) {
  if (!condition) throw new Error(`expected ${what}`);
}

function within(promise, ms = STEP_MS) {
  let timer;
  const limit = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms);
  });
  return Promise.race([promise, limit]).finally(() => clearTimeout(timer));
}

async function check(name, body) {
  try {
    await within(body());
    report(name, true);
  } catch (error) {
    report(name, false, String(error?.message ?? error).split('\n')[0]);
  }
}

async function collect(iterable) {
  const items = [];
  for await (const item of iterable) items.push(item);
  return items;
}

const user = (content) => [{ role: 'user', content }];
const schema = JSON.stringify({
  type: 'object',
  properties: { answer: { type: 'string' }, count: { type: 'integer' } },
  required: ['answer', 'count'],
});
let sid = '';

await check('healthCheck', async () => {
  const r = await client.healthCheck();
  expect(r.status === 'STATUS_HEALTHY', `STATUS_HEALTHY, got ${r.status}`);
});
await check('getCapabilities', async () => {
  const r = await client.getCapabilities();
  expect(r.info?.name, 'info.name');
});
await check('initialize with env', async () => {
  const r = await client.initialize(workspace, { A3S_TS_SDK_CHECK: '1' });
  expect(r.success === true, `success, got ${JSON.stringify(r)}`);
});
await check('createSession', async () => {
  const r = await client.createSession({ name: 'ts-sdk-check', workspace, storageType: sdk.StorageType.STORAGE_TYPE_MEMORY });
  sid = r.sessionId;
  expect(sid, 'a session id');
});
await check('listSessions', async () => {
  const r = await client.listSessions();
  expect(r.sessions.some((s) => s.sessionId === sid), 'the new session listed');
});
await check('getSession', async () => {
  const r = await client.getSession(sid);
  expect(r.session?.sessionId === sid, 'the session');
});
await check('configureSession', async () => {
  const r = await client.configureSession(sid, { name: 'ts-sdk-check', workspace, systemPrompt: 'Be brief.' });
  expect(r.session?.sessionId === sid, 'the session back');
});
await check('generate', async () => {
  const r = await client.generate(sid, user('Say hello.'));
  expect(r.message?.role === 'assistant', `role "assistant", got ${JSON.stringify(r.message?.role)}`);
  expect(r.finishReason === 'stop', `finishReason "stop", got ${JSON.stringify(r.finishReason)}`);
  expect(r.message?.content, 'content');
});
await check('streamGenerate', async () => {
  const chunks = await collect(client.streamGenerate(sid, user('Say hello again.')));
  const types = chunks.map((c) => c.type);
  expect(types.includes('content'), `a "content" chunk, got ${types}`);
  const last = chunks[chunks.length - 1];
  expect(last?.type === 'done' && last.finishReason === 'stop', `last chunk done/stop, got ${JSON.stringify(last)}`);
});
await check('generateStructured', async () => {
  const r = await client.generateStructured(sid, user('Answer in JSON.'), schema);
  expect(typeof JSON.parse(r.data).answer === 'string', `data with "answer", got ${r.data}`);
});
await check('streamGenerateStructured', async () => {
  const chunks = await collect(client.streamGenerateStructured(sid, user('Answer in JSON.'), schema));
  const last = chunks[chunks.length - 1];
  expect(last?.done && typeof JSON.parse(last.data).answer === 'string', `a done chunk with the data, got ${JSON.stringify(last)}`);
  // streaming-demo concatenates every chunk's data and parses that (A3S Code sends one chunk).
  const joined = chunks.map((c) => c.data).join('');
  expect(joined === last.data, `the chunks' data to concatenate to the JSON, got ${chunks.length} chunks: ${joined}`);
});
await check('getMessages (later-only)', async () => {
  const r = await client.getMessages(sid, 2, 0);
  expect(r.messages.length === 2 && r.totalCount >= 4 && r.hasMore, `2 of >=4 messages, got ${JSON.stringify(r).slice(0, 200)}`);
  expect(['user', 'assistant', 'system', 'tool'].includes(r.messages[0].role), `a string role, got ${r.messages[0].role}`);
});
await check('subscribeEvents', async () => {
  const seen = [];
  const events = client.subscribeEvents(sid)[Symbol.asyncIterator]();
  const first = events.next();
  await new Promise((resolve) => setTimeout(resolve, 300));
  await client.generate(sid, user('Once more.'));
  seen.push((await within(first, 5000)).value);
  expect(seen[0]?.type?.startsWith('EVENT_TYPE_'), `an event, got ${JSON.stringify(seen[0])}`);
});
await check('getContextUsage', async () => {
  const r = await client.getContextUsage(sid);
  expect(r.usage?.messageCount > 0 || r.usage?.totalTokens > 0, `usage, got ${JSON.stringify(r)}`);
});
await check('compactContext', () => client.compactContext(sid));
await check('clearContext', () => client.clearContext(sid));
await check('cancel', () => client.cancel(sid));
await check('pause', () => client.pause(sid));
await check('resume', () => client.resume(sid));
await check('confirmToolExecution (unknown id)', async () => {
  const r = await client.confirmToolExecution(sid, 'no-such-tool-call', true);
  expect(r.success === false && r.error, `success=false with an error, got ${JSON.stringify(r)}`);
});
await check('setConfirmationPolicy', () =>
  client.setConfirmationPolicy(sid, {
    enabled: true, autoApproveTools: ['read_file'], requireConfirmTools: ['bash'], defaultTimeoutMs: 30000,
    timeoutAction: 'TIMEOUT_ACTION_REJECT', yoloLanes: [],
  }));
await check('getConfirmationPolicy', async () => {
  const r = await client.getConfirmationPolicy(sid);
  expect(r.policy?.enabled === true && r.policy.requireConfirmTools.includes('bash'), `the policy set, got ${JSON.stringify(r)}`);
});
await check('setLaneHandler', () =>
  client.setLaneHandler(sid, 'SESSION_LANE_EXECUTE', { mode: 'TASK_HANDLER_MODE_INTERNAL', timeoutMs: 60000 }));
await check('getLaneHandler', async () => {
  const r = await client.getLaneHandler(sid, 'SESSION_LANE_EXECUTE');
  expect(r.config?.mode === 'TASK_HANDLER_MODE_INTERNAL', `mode INTERNAL, got ${JSON.stringify(r)}`);
});
await check('completeExternalTask (unknown id)', async () => {
  const r = await client.completeExternalTask(sid, 'no-such-task', true, 'ok');
  expect(r.success === false, `success=false, got ${JSON.stringify(r)}`);
});
await check('listPendingExternalTasks', async () => {
  const r = await client.listPendingExternalTasks(sid);
  expect(Array.isArray(r.tasks), 'a task list');
});
await check('setPermissionPolicy', () =>
  client.setPermissionPolicy(sid, {
    deny: [{ rule: 'Read(secret/**)' }], allow: [], ask: [], defaultDecision: 'PERMISSION_DECISION_ALLOW', enabled: true,
  }));
await check('getPermissionPolicy', async () => {
  const r = await client.getPermissionPolicy(sid);
  expect(r.policy?.deny?.[0]?.rule === 'Read(secret/**)', `the deny rule, got ${JSON.stringify(r)}`);
});
await check('checkPermission (A3S Code names)', async () => {
  const r = await client.checkPermission(sid, 'read', JSON.stringify({ file_path: 'secret/key.txt' }));
  expect(r.decision === 'PERMISSION_DECISION_DENY', `DENY, got ${r.decision}`);
});
await check('addPermissionRule', () => client.addPermissionRule(sid, 'allow', 'Bash(ls:*)'));
await check('loadSkill', async () => {
  const content = '---\nname: ts-check\ndescription: A skill sent by the SDK check.\n---\nSay hi.\n';
  const r = await client.loadSkill(sid, 'ts-check', content);
  expect(r.success === true, `success, got ${JSON.stringify(r)}`);
});
await check('listSkills', async () => {
  const r = await client.listSkills(sid);
  expect(r.skills.some((s) => s.name === 'ts-check'), 'the loaded skill listed');
});
await check('unloadSkill', () => client.unloadSkill(sid, 'ts-check'));
await check('setTodos (later-only)', () =>
  client.setTodos(sid, [{ id: '1', content: 'check the SDK', status: 'pending', priority: 'high' }]));
await check('getTodos (later-only)', async () => {
  const r = await client.getTodos(sid);
  expect(r.todos?.[0]?.content === 'check the SDK', `the todo set, got ${JSON.stringify(r)}`);
});
await check('listMcpServers (later-only)', async () => {
  const r = await client.listMcpServers();
  expect(Array.isArray(r.servers), `a server list, got ${JSON.stringify(r)}`);
});
await check('getMcpTools (later-only)', async () => {
  const r = await client.getMcpTools();
  expect(Array.isArray(r.tools), `a tool list, got ${JSON.stringify(r)}`);
});
await check('addProvider (later-only)', async () => {
  const r = await client.addProvider({ name: 'ts-check', apiKey: 'sk-ts-check-0123456789',
    baseUrl: 'https://llm.example/v1', models: [{ id: 'm1', name: 'M1', cost: { input: 1, output: 2 } }] });
  expect(r.success === true && r.provider?.name === 'ts-check', `the entry, got ${JSON.stringify(r)}`);
  expect(!r.provider.apiKey, 'no api key answered');
});
await check('listProviders, getProvider (later-only)', async () => {
  const listed = await client.listProviders();
  expect(listed.providers.some((p) => p.name === 'ts-check'), `the entry listed, got ${JSON.stringify(listed)}`);
  const r = await client.getProvider('ts-check');
  expect(r.provider?.models?.[0]?.cost?.output === 2, `its model, got ${JSON.stringify(r)}`);
});
await check('updateProvider (later-only)', async () => {
  const r = await client.updateProvider({ name: 'ts-check', baseUrl: 'https://llm.example/v2', models: [] });
  expect(r.provider?.baseUrl === 'https://llm.example/v2', `the new base URL, got ${JSON.stringify(r)}`);
});
await check('setDefaultModel, getDefaultModel (later-only)', async () => {
  await client.setDefaultModel('ts-check', 'm1');
  const r = await client.getDefaultModel();
  expect(r.provider === 'ts-check' && r.model === 'm1', `the default, got ${JSON.stringify(r)}`);
});
await check('removeProvider (later-only)', async () => {
  const r = await client.removeProvider('ts-check');
  expect(r.success === true, `success, got ${JSON.stringify(r)}`);
});
await check('destroySession', async () => {
  const r = await client.destroySession(sid);
  expect(r.success === true, 'success');
});
await check('shutdown', async () => {
  const r = await client.shutdown();
  expect(r.success === true, `success, got ${JSON.stringify(r)}`);
});
client.close();
