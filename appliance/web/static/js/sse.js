// Server-Sent Events over fetch (EventSource cannot send an Authorization header).

/** An incremental text/event-stream parser: feed text, get the data of each complete event. */
export class SSEParser {
  constructor() {
    this.rest = "";
    this.data = [];
  }

  feed(text) {
    const lines = (this.rest + text).split(/\r\n|\r|\n/);
    this.rest = lines.pop();
    const events = [];
    for (const line of lines) {
      if (line === "") {
        if (this.data.length) events.push(this.data.join("\n"));
        this.data = [];
      } else if (line.startsWith("data:")) {
        this.data.push(line.slice(line.startsWith("data: ") ? 6 : 5));
      }
    }
    return events;
  }
}

/** The data of each event of a fetch Response's body, until [DONE] or the end. */
export async function* sseData(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  const parser = new SSEParser();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      for (const data of parser.feed(decoder.decode(value, { stream: true }))) {
        if (data === "[DONE]") return;
        yield data;
      }
    }
  } finally {
    reader.releaseLock();
  }
}
