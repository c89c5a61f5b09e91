// client.mjs BASE_URL [PREFIX] - drives `deltafin serve` with the official openai
// npm client: chat and completions, streaming and not, and an error the server
// must refuse. Prints "ok PREFIXNAME" or "FAIL PREFIXNAME: why" per check
// (test_server.sh counts them; it runs this against several models). Temperature
// 0 throughout, so streamed and whole answers must agree.
import OpenAI from "openai";

const base = process.argv[2];
const client = new OpenAI({ baseURL: base, apiKey: process.env.DF_API_KEY || "none", maxRetries: 0 });
let failed = 0;
const pre = process.argv[3] || "";
const ok = (n) => console.log(`ok ${pre}${n}`);
const bad = (n, why) => { failed++; console.log(`FAIL ${pre}${n}: ${why}`); };
const check = (n, cond, why) => (cond ? ok(n) : bad(n, why));

const messages = [{ role: "system", content: "Be brief." }, { role: "user", content: "Name three colours." }];

try {
  const models = await client.models.list();
  check("node-models", models.data.length === 1 && models.data[0].object === "model", JSON.stringify(models.data));

  const chat = await client.chat.completions.create({ model: "m", messages, max_tokens: 12, temperature: 0 });
  const c0 = chat.choices[0];
  check("node-chat", chat.object === "chat.completion" && c0.message.role === "assistant" &&
        typeof c0.message.content === "string" && ["stop", "length"].includes(c0.finish_reason) &&
        chat.usage.total_tokens === chat.usage.prompt_tokens + chat.usage.completion_tokens,
        JSON.stringify(chat));

  const stream = await client.chat.completions.create({ model: "m", messages, max_tokens: 12, temperature: 0,
                                                        stream: true, stream_options: { include_usage: true } });
  let text = "", finish = null, usage = null, role = null;
  for await (const ch of stream) {
    if (ch.usage) usage = ch.usage;
    if (!ch.choices.length) continue;
    const d = ch.choices[0].delta;
    if (d.role) role = d.role;
    if (d.content) text += d.content;
    if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
  }
  check("node-chat-stream", text === c0.message.content && finish === c0.finish_reason && role === "assistant",
        `stream '${text}' (${finish}) vs '${c0.message.content}' (${c0.finish_reason})`);
  check("node-chat-stream-usage", usage && usage.completion_tokens === chat.usage.completion_tokens &&
        usage.prompt_tokens === chat.usage.prompt_tokens, JSON.stringify(usage));

  const cmpl = await client.completions.create({ model: "m", prompt: "The quick brown fox", max_tokens: 10,
                                                 temperature: 0 });
  check("node-completion", cmpl.object === "text_completion" && typeof cmpl.choices[0].text === "string" &&
        cmpl.usage.completion_tokens >= 1, JSON.stringify(cmpl));
  const cs = await client.completions.create({ model: "m", prompt: "The quick brown fox", max_tokens: 10,
                                               temperature: 0, stream: true });
  let ct = "";
  for await (const ch of cs) ct += ch.choices[0]?.text ?? "";
  check("node-completion-stream", ct === cmpl.choices[0].text, `'${ct}' vs '${cmpl.choices[0].text}'`);

  try {
    await client.chat.completions.create({ model: "m", messages, n: 2 });
    bad("node-error-400", "n = 2 was accepted");
  } catch (e) {
    check("node-error-400", e.status === 400 && e.param === "n" && e.type === "invalid_request_error",
          `${e.status} ${e.param} ${e.type} ${e.message}`);
  }
} catch (e) {
  bad("node-client", `${e.status ?? ""} ${e.message}`);
}
process.exit(failed ? 1 : 0);
