// pcache.mjs BASE_URL SYSTEM USER - one chat turn through the official openai npm
// client, whole and streamed (with include_usage), temperature 0; prints one JSON
// line: the text, usage.prompt_tokens and usage.prompt_tokens_details.cached_tokens
// of each (test_server.sh: the prompt cache across a server restart).
import OpenAI from "openai";

const [base, system, user] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base, apiKey: "none", maxRetries: 0 });
const messages = [{ role: "system", content: system }, { role: "user", content: user }];
try {
  const r = await client.chat.completions.create({ model: "m", messages, max_tokens: 8, temperature: 0 });
  const s = await client.chat.completions.create({ model: "m", messages, max_tokens: 8, temperature: 0,
                                                   stream: true, stream_options: { include_usage: true } });
  let text = "", usage = null;
  for await (const ch of s) {
    if (ch.usage) usage = ch.usage;
    if (ch.choices.length && ch.choices[0].delta.content) text += ch.choices[0].delta.content;
  }
  console.log(JSON.stringify({ text: r.choices[0].message.content, prompt: r.usage.prompt_tokens,
                               cached: r.usage.prompt_tokens_details?.cached_tokens ?? null,
                               stream_text: text, stream_cached: usage?.prompt_tokens_details?.cached_tokens ?? null }));
} catch (e) {
  console.log(JSON.stringify({ error: `${e.status ?? ""} ${e.message}` }));
  process.exit(1);
}
