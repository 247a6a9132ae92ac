// The conversation list beside the chat: new, select, rename, delete, export and import.

import { $, fill, h } from "./dom.js";

export class ConversationList {
  constructor(store, showError) {
    this.store = store;
    this.showError = showError;
    this.list = $("#conversation-list");
    $("#new-chat").addEventListener("click", () => store.create());
    $("#export-chats").addEventListener("click", () => this.exportAll());
    const file = $("#import-file");
    $("#import-chats").addEventListener("click", () => file.click());
    file.addEventListener("change", () => this.importFile(file));
    store.onChange(() => this.render());
  }

  render() {
    const current = this.store.currentId();
    const items = this.store.list().map((c) =>
      h(
        "li",
        { class: c.id === current ? "current" : "", dataset: { id: c.id } },
        h("button", { type: "button", class: "title", onclick: () => this.select(c.id) }, c.title),
        h("button", { type: "button", class: "rename", title: "Rename", onclick: () => this.rename(c) }, "✎"),
        h("button", { type: "button", class: "delete", title: "Delete", onclick: () => this.remove(c) }, "✕"),
      ),
    );
    fill(this.list, items);
  }

  select(id) {
    this.store.setCurrent(id);
    this.store.save();
  }

  rename(c) {
    const title = window.prompt("Rename the conversation", c.title);
    if (title !== null) this.store.rename(c.id, title);
  }

  remove(c) {
    if (window.confirm(`Delete "${c.title}"?`)) this.store.remove(c.id); // none left: a new one
  }

  exportAll() {
    const blob = new Blob([this.store.exportJSON()], { type: "application/json" });
    const url = URL.createObjectURL(blob);
    const link = h("a", { href: url, download: "conversations.json" });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  }

  async importFile(input) {
    const [file] = input.files;
    input.value = "";
    if (!file) return;
    try {
      const added = this.store.importJSON(await file.text());
      this.showError(`imported ${added} conversation${added === 1 ? "" : "s"}`);
    } catch (error) {
      this.showError(`cannot import ${file.name}: ${error.message}`);
    }
  }
}
