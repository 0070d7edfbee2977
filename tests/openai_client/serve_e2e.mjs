// `k3flow serve` driven by the official `openai` npm client, as an application would use it.
// tests/test_serve_openai_client.cpp starts the server and runs
//
//   node tests/openai_client/serve_e2e.mjs BASE_URL
//
// with the expectations in the environment: K3FLOW_MODEL (the served model's id), K3FLOW_API_KEY,
// K3FLOW_PROMPT, K3FLOW_MAX_TOKENS and K3FLOW_EXPECT_IDS (comma-separated: the ids `k3flow generate`
// gives for that prompt, greedy), K3FLOW_EXPECT_CHAT_IDS (the ids `k3flow generate --ids` gives, greedy,
// for the XTML render of `chatMessages` with thinking off: the chat reply's ids, up to 8). Each case is one async function in `cases`; add a case by adding
// a function. Every case runs; the script prints `ok NAME` or `FAIL NAME: why` per case and exits 1
// if any failed.
import OpenAI from 'openai';

const baseURL = process.argv[2];
const env = (name) => {
  const v = process.env[name];
  if (v === undefined) throw new Error(`${name} is not set`);
  return v;
};
const model = env('K3FLOW_MODEL');
const apiKey = env('K3FLOW_API_KEY');
const prompt = env('K3FLOW_PROMPT');
const maxTokens = Number(env('K3FLOW_MAX_TOKENS'));
const expectIds = env('K3FLOW_EXPECT_IDS').split(',').map(Number);
const expectChatIds = env('K3FLOW_EXPECT_CHAT_IDS').split(',').map(Number);

// No retries: a failure must show as itself, not as a slow success.
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });

function check(cond, what) {
  if (!cond) throw new Error(what);
}
function sameIds(got, want, what) {
  check(JSON.stringify(got) === JSON.stringify(want), `${what}: ids ${JSON.stringify(got)} != ${JSON.stringify(want)}`);
}

const chatMessages = [
  { role: 'system', content: 'Be brief.' },
  { role: 'user', content: 'Name a colour.' },
];

const cases = {
  async modelsList() {
    const ids = [];
    for await (const m of client.models.list()) ids.push(m.id);
    sameIds(ids, [model], 'models.list');
  },

  async modelsRetrieve() {
    const m = await client.models.retrieve(model);
    check(m.id === model && m.object === 'model', `models.retrieve: ${JSON.stringify(m)}`);
    try {
      await client.models.retrieve('no-such-model');
      check(false, 'models.retrieve of another id succeeded');
    } catch (e) {
      check(e instanceof OpenAI.NotFoundError, `another id: ${e}`);
    }
  },

  // `return_token_ids` is k3flow's extension; the client passes unknown fields through both ways.
  async completion() {
    const r = await client.completions.create({ model, prompt, max_tokens: maxTokens, return_token_ids: true });
    check(r.object === 'text_completion', `object ${r.object}`);
    const c = r.choices[0];
    sameIds(c.token_ids, expectIds, 'completions.create');
    check(c.finish_reason === 'length', `finish_reason ${c.finish_reason}`);
    check(r.usage.completion_tokens === maxTokens, `usage ${JSON.stringify(r.usage)}`);
  },

  async completionStream() {
    const stream = await client.completions.create({
      model, prompt, max_tokens: maxTokens, stream: true, return_token_ids: true,
      stream_options: { include_usage: true },
    });
    const ids = [];
    let text = '', finish = null, usage = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        text += c.text;
        ids.push(...(c.token_ids ?? []));
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    sameIds(ids, expectIds, 'streamed completions.create');
    const whole = await client.completions.create({ model, prompt, max_tokens: maxTokens });
    check(text === whole.choices[0].text, 'streamed text differs from the whole text');
    check(finish === 'length', `finish_reason ${finish}`);
    check(usage && usage.completion_tokens === maxTokens, `usage ${JSON.stringify(usage)}`);
  },

  async chat() {
    const r = await client.chat.completions.create({ model, messages: chatMessages, max_tokens: 8, thinking: false });
    check(r.object === 'chat.completion', `object ${r.object}`);
    const m = r.choices[0].message;
    check(m.role === 'assistant' && typeof m.content === 'string', `message ${JSON.stringify(m)}`);
    check(r.usage.completion_tokens > 0 && r.usage.prompt_tokens > 0, `usage ${JSON.stringify(r.usage)}`);
  },

  // The reply's ids are generate's for the rendered conversation, whole and streamed.
  async chatIds() {
    const body = { model, messages: chatMessages, max_tokens: 8, thinking: false, return_token_ids: true };
    const whole = await client.chat.completions.create(body);
    sameIds(whole.choices[0].token_ids, expectChatIds, 'chat.completions.create');
    const stream = await client.chat.completions.create({ ...body, stream: true });
    const ids = [];
    for await (const chunk of stream) ids.push(...(chunk.choices[0]?.token_ids ?? []));
    sameIds(ids, expectChatIds, 'streamed chat.completions.create');
  },

  async chatStream() {
    const body = { model, messages: chatMessages, max_tokens: 8, thinking: false, return_token_ids: true };
    const whole = await client.chat.completions.create(body);
    const stream = await client.chat.completions.create({ ...body, stream: true });
    let content = '', role = null;
    const ids = [];
    for await (const chunk of stream) {
      const d = chunk.choices[0]?.delta ?? {};
      role ??= d.role;
      content += d.content ?? '';
      ids.push(...(chunk.choices[0]?.token_ids ?? []));
    }
    check(role === 'assistant', `first delta role ${role}`);
    check(content === whole.choices[0].message.content, 'streamed content differs from the whole reply');
    sameIds(ids, whole.choices[0].token_ids, 'streamed chat');
  },

  // Greedy: the chosen token is the most likely, so its logprob heads its own top list.
  async chatLogprobs() {
    const r = await client.chat.completions.create({
      model, messages: chatMessages, max_tokens: 6, thinking: false, logprobs: true, top_logprobs: 3,
    });
    const content = r.choices[0].logprobs?.content ?? [];
    check(content.length === r.usage.completion_tokens, `${content.length} logprobs for ${r.usage.completion_tokens} tokens`);
    for (const t of content) {
      check(t.logprob <= 0 && t.top_logprobs.length === 3, `token ${JSON.stringify(t)}`);
      check(t.top_logprobs[0].logprob === t.logprob, `greedy token not the top one: ${JSON.stringify(t)}`);
      for (let i = 1; i < 3; ++i) check(t.top_logprobs[i].logprob <= t.top_logprobs[i - 1].logprob, 'top list not sorted');
    }
  },

  async completionLogprobs() {
    const r = await client.completions.create({ model, prompt, max_tokens: maxTokens, logprobs: 2 });
    const lp = r.choices[0].logprobs;
    check(lp && lp.tokens.length === maxTokens && lp.token_logprobs.length === maxTokens, `logprobs ${JSON.stringify(lp)}`);
    check(lp.token_logprobs.every((v) => v <= 0), 'a logprob above 0');
    check(lp.top_logprobs.every((o) => Object.keys(o).length >= 1 && Object.keys(o).length <= 2), 'top_logprobs size');
  },

  // Sampling constrained to the schema: the reply parses and takes one of the enum's values.
  async jsonSchema() {
    const r = await client.chat.completions.create({
      model, messages: chatMessages, max_tokens: 200, seed: 7, temperature: 1,
      response_format: {
        type: 'json_schema',
        json_schema: {
          name: 'colour', strict: true,
          schema: { type: 'object', properties: { colour: { enum: ['red', 'green', 'blue'] } }, required: ['colour'] },
        },
      },
    });
    const c = r.choices[0];
    check(c.finish_reason === 'stop', `finish_reason ${c.finish_reason}: ${JSON.stringify(c.message)}`);
    const v = JSON.parse(c.message.content);
    check(['red', 'green', 'blue'].includes(v.colour), `content ${c.message.content}`);
  },

  // A tool round trip as an agent framework sends it: the assistant's tool_calls and the tool's
  // result go back in; tool_choice none asks the model not to call again.
  async toolResult() {
    const tools = [{
      type: 'function',
      function: { name: 'get_weather', description: 'Weather in a city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } },
    }];
    const r = await client.chat.completions.create({
      model, max_tokens: 6, thinking: false, tools, tool_choice: 'none',
      messages: [
        { role: 'developer', content: 'Use tools when they help.' },
        { role: 'user', content: 'Weather in Paris?' },
        { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
        { role: 'tool', tool_call_id: 'call_1', content: '{"temp_c":18}' },
      ],
    });
    check(r.choices[0].message.role === 'assistant' && r.usage.prompt_tokens > 0, `reply ${JSON.stringify(r)}`);
  },

  async unknownFieldRefused() {
    try {
      await client.chat.completions.create({ model, messages: chatMessages, max_tokens: 2, logit_bias: { 5: 10 } });
      check(false, 'logit_bias was accepted');
    } catch (e) {
      check(e instanceof OpenAI.BadRequestError && String(e.message).includes('logit_bias'), `logit_bias: ${e}`);
    }
  },

  async wrongKey() {
    const bad = new OpenAI({ baseURL, apiKey: 'wrong-key', maxRetries: 0 });
    try {
      await bad.models.list();
      check(false, 'a wrong key was let through');
    } catch (e) {
      check(e instanceof OpenAI.AuthenticationError && e.status === 401, `wrong key: ${e}`);
    }
  },
};

let failed = 0;
for (const [name, run] of Object.entries(cases)) {
  try {
    await run();
    console.log(`ok ${name}`);
  } catch (e) {
    failed += 1;
    console.log(`FAIL ${name}: ${e?.stack ?? e}`);
  }
}
process.exit(failed ? 1 : 0);
