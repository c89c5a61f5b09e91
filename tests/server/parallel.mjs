// parallel.mjs REF_URL BATCH_URL - continuous batching (`serve --parallel`) through the
// official openai npm client. REF_URL is a --parallel 1 server, BATCH_URL a --parallel 4
// one over the same model. Each request is first served alone by REF; then on BATCH
// five run at once (more than its 4 slots: one waits and joins later), streamed and
// not, chat and completions, a stop string, penalties and a seeded sample among them;
// then requests join while others are decoding, and one of those is aborted by its
// client mid-stream: every other text must equal its solo text. Prints "ok NAME" or
// "FAIL NAME: why" per check (test_server.sh counts them).
import OpenAI from "openai";

const [refUrl, batchUrl] = process.argv.slice(2);
const ref = new OpenAI({ baseURL: refUrl, apiKey: "none", maxRetries: 0 });
const bat = new OpenAI({ baseURL: batchUrl, apiKey: "none", maxRetries: 0 });
let failed = 0;
const ok = (n) => console.log(`ok ${n}`);
const bad = (n, why) => { failed++; console.log(`FAIL ${n}: ${why}`); };
const check = (n, cond, why) => (cond ? ok(n) : bad(n, why));

const chatOf = (u) => [{ role: "user", content: u }];
// kind, body (without model), streamed: different prompts and lengths
const reqs = [
  ["cmpl", { prompt: "The quick brown fox jumps over", max_tokens: 90, temperature: 0 }, true],
  ["cmpl", { prompt: "Once upon a time, in a land far away, there lived", max_tokens: 40, temperature: 0 }, false],
  ["chat", { messages: chatOf("Name three colours."), max_tokens: 60, temperature: 0,
             chat_template_kwargs: { enable_thinking: false } }, true],
  ["cmpl", { prompt: "1, 2, 3, 4,", max_tokens: 70, temperature: 0, presence_penalty: 0.8,
             frequency_penalty: 0.5 }, false],
  ["cmpl", { prompt: "A seeded sample:", max_tokens: 50, temperature: 0.9, top_p: 0.95, seed: 1234 }, true],
  ["chat", { messages: chatOf("Tell me about the sea, at length."), max_tokens: 120, temperature: 0,
             chat_template_kwargs: { enable_thinking: false } }, false],
];

// One request; onText(text so far) after each streamed piece. Returns {text, finish, usage}.
async function run(client, [kind, body, stream], onText, signal) {
  const api = kind === "chat" ? client.chat.completions : client.completions;
  const piece = (c) => (kind === "chat" ? c.delta?.content ?? "" : c.text ?? "");
  if (!stream) {
    const r = await api.create({ model: "m", ...body }, { signal });
    const c = r.choices[0];
    return { text: kind === "chat" ? c.message.content : c.text, finish: c.finish_reason, usage: r.usage };
  }
  const s = await api.create({ model: "m", ...body, stream: true, stream_options: { include_usage: true } },
                             { signal });
  let text = "", finish = null, usage = null;
  for await (const ch of s) {
    if (ch.usage) usage = ch.usage;
    if (!ch.choices.length) continue;
    text += piece(ch.choices[0]);
    if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
    if (onText) onText(text);
  }
  return { text, finish, usage };
}

const same = (a, b) => a.text === b.text && a.finish === b.finish &&
  a.usage.completion_tokens === b.usage.completion_tokens && a.usage.prompt_tokens === b.usage.prompt_tokens;
const show = (a) => JSON.stringify([a.text.slice(0, 60), a.finish, a.usage?.completion_tokens]);

async function metric(name) {
  const t = await (await fetch(batchUrl.replace(/\/v1$/, "") + "/metrics")).text();
  const m = t.match(new RegExp(`^${name.replace(/[{}"+]/g, "\\$&")} (\\S+)$`, "m"));
  return m ? Number(m[1]) : NaN;
}

try {
  // alone, on the --parallel 1 server
  const solo = [];
  for (const r of reqs) solo.push(await run(ref, r));
  // a stop string: the solo text's middle, so that it matches there
  const stopReq = ["cmpl", { prompt: "The quick brown fox jumps over", max_tokens: 90, temperature: 0,
                             stop: [solo[0].text.slice(20, 24)] }, true];
  solo.push(await run(ref, stopReq));
  reqs.push(stopReq);
  check("parallel-solo-stop", solo[6].finish === "stop" && solo[6].text.length < solo[0].text.length,
        show(solo[6]));

  // the first five together, then the others as slots free up
  const got = await Promise.all(reqs.map((r) => run(bat, r)));
  const diff = got.map((g, i) => (same(g, solo[i]) ? null : `${i}: ${show(g)} != ${show(solo[i])}`)).filter((x) => x);
  check("parallel-equals-solo", diff.length === 0, diff.join("; "));

  // a seeded sample: alone on the batch server too
  const again = await run(bat, reqs[4]);
  check("parallel-seed", same(again, solo[4]) && same(got[4], solo[4]), `${show(again)} ${show(got[4])}`);

  // joining while others decode: `doomed` (streamed, with room for thousands of tokens)
  // is decoding when the late ones join, and its client aborts it once the first of
  // them is done, while the others still run
  const c0 = await metric("deltafin_requests_cancelled_total");
  let started = 0, release;
  const twoStarted = new Promise((res) => (release = res));
  const onStart = () => { if (++started === 2) release(); };
  let abortedText = "";
  const ac = new AbortController();
  let doomedSeen = false, longSeen = false;
  const long = run(bat, reqs[0], (t) => { if (t && !longSeen) longSeen = true, onStart(); });
  const doomed = run(bat, ["cmpl", { prompt: "This one will be cut short", max_tokens: 8000, temperature: 0 }, true],
                     (t) => { abortedText = t; if (t && !doomedSeen) doomedSeen = true, onStart(); }, ac.signal)
    // the client may end the stream quietly or throw: either way it has no finish_reason
    .then((r) => (ac.signal.aborted && !r.finish ? "aborted" : `finished: ${r.finish}`),
          (e) => (ac.signal.aborted ? "aborted" : `error ${e}`));
  await twoStarted;
  const late = [run(bat, reqs[1]), run(bat, reqs[2]), run(bat, reqs[3]), run(bat, reqs[5])];
  late[0].then(() => ac.abort(), () => ac.abort());
  const [g0, d, g1, g2, g3, g5] = await Promise.all([long, doomed, ...late]);
  const bad2 = [[g0, 0], [g1, 1], [g2, 2], [g3, 3], [g5, 5]]
    .filter(([g, i]) => !same(g, solo[i])).map(([g, i]) => `${i}: ${show(g)} != ${show(solo[i])}`);
  check("parallel-join-while-decoding", bad2.length === 0, bad2.join("; "));
  check("parallel-abort-mid-stream", d === "aborted" && abortedText.length > 0, `${d} after '${abortedText}'`);
  let c1 = c0;
  for (let i = 0; i < 100 && c1 === c0; i++) { // the server sees the closed socket within a poll or two
    await new Promise((r) => setTimeout(r, 100));
    c1 = await metric("deltafin_requests_cancelled_total");
  }
  check("parallel-abort-counted", c1 === c0 + 1, `cancelled ${c0} -> ${c1}`);

  // occupancy: steps with more than one request in them
  const most = await metric("deltafin_batch_active_max");
  const one = await metric('deltafin_batch_requests_per_step_bucket{le="1"}');
  const all = await metric("deltafin_batch_requests_per_step_count");
  check("parallel-occupancy-metrics", most >= 2 && all > one && one >= 0, `max ${most}, steps ${all}, of one ${one}`);
} catch (e) {
  bad("parallel-client", `${e.status ?? ""} ${e.message}`);
}
process.exit(failed ? 1 : 0);
