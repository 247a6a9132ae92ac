// Conversations kept in this browser's localStorage: list, new, rename, delete, export, import.
// A conversation: {id, title, updated, messages: [{role, content, images?, reasoning?, stats?}]},
// images as data URLs.

const STORAGE = "appliance.conversations";
const CURRENT = "appliance.currentConversation";
const EXPORT_KIND = "llm-appliance.conversations";

function load() {
  try {
    const list = JSON.parse(localStorage.getItem(STORAGE) || "[]");
    return Array.isArray(list) ? list.filter(isConversation) : [];
  } catch {
    return [];
  }
}

function isConversation(c) {
  return c && typeof c.id === "string" && Array.isArray(c.messages);
}

function isImageList(images) {
  return Array.isArray(images) && images.every((url) => typeof url === "string" && url.startsWith("data:image/"));
}

function newId() {
  return `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 8)}`;
}

export class Store {
  constructor() {
    this.conversations = load();
    this.listeners = [];
    this.errorListeners = [];
  }

  /** `listener(message)` runs when the browser refuses to keep the conversations (full). */
  onError(listener) {
    this.errorListeners.push(listener);
  }

  /** `listener()` runs after every change. */
  onChange(listener) {
    this.listeners.push(listener);
  }

  save() {
    try {
      localStorage.setItem(STORAGE, JSON.stringify(this.conversations));
    } catch (error) {
      const message = `this browser's storage is full, the conversations are not saved: ${error.message}`;
      this.errorListeners.forEach((listener) => listener(message));
    }
    this.listeners.forEach((listener) => listener());
  }

  /** Newest first. */
  list() {
    return [...this.conversations].sort((a, b) => b.updated - a.updated);
  }

  get(id) {
    return this.conversations.find((c) => c.id === id) || null;
  }

  currentId() {
    return localStorage.getItem(CURRENT);
  }

  setCurrent(id) {
    localStorage.setItem(CURRENT, id);
  }

  create() {
    const c = { id: newId(), title: "New chat", updated: Date.now(), messages: [] };
    this.conversations.push(c);
    this.setCurrent(c.id);
    this.save();
    return c;
  }

  touch(c) {
    c.updated = Date.now();
    if (c.title === "New chat") {
      const first = c.messages.find((m) => m.role === "user");
      if (first) c.title = first.content.slice(0, 40) || "New chat";
    }
    this.save();
  }

  rename(id, title) {
    const c = this.get(id);
    if (c && title.trim()) {
      c.title = title.trim().slice(0, 80);
      this.save();
    }
  }

  /** Removing the current conversation makes the newest of the rest current (before anyone
   * hears of the change: a view drawing "the current one" would otherwise start a new one). */
  remove(id) {
    this.conversations = this.conversations.filter((c) => c.id !== id);
    const next = this.list()[0];
    if (this.currentId() === id && next) this.setCurrent(next.id);
    this.save();
  }

  exportJSON() {
    return JSON.stringify({ kind: EXPORT_KIND, conversations: this.conversations }, null, 2);
  }

  /** Adds the conversations of an export (new ids where one is taken); returns how many. */
  importJSON(text) {
    const doc = JSON.parse(text);
    const list = Array.isArray(doc) ? doc : doc?.conversations;
    if (!Array.isArray(list)) throw new Error("not a conversations export");
    let added = 0;
    for (const c of list.filter(isConversation)) {
      const messages = c.messages
        .filter((m) => m && typeof m.content === "string" && ["user", "assistant"].includes(m.role))
        .map((m) => ({
          role: m.role,
          content: m.content,
          reasoning: String(m.reasoning || ""),
          ...(isImageList(m.images) && { images: m.images }),
        }));
      const id = this.get(c.id) ? newId() : c.id;
      const title = String(c.title || "Imported chat").slice(0, 80);
      this.conversations.push({ id, title, updated: Number(c.updated) || Date.now(), messages });
      added += 1;
    }
    this.save();
    return added;
  }
}
