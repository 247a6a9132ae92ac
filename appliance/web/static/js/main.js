// The page's entry: the two views (chat, dashboard), the API-key dialog, and start-up.

import { apiKey, onKeyRefused, setApiKey } from "./api.js";
import { Chat } from "./chat.js";
import { ConversationList } from "./conversations.js";
import { Dashboard } from "./dashboard.js";
import { $ } from "./dom.js";
import { Store } from "./store.js";

const store = new Store();
const notice = $("#notice");

function showNotice(text) {
  notice.textContent = text;
  notice.hidden = !text;
}

store.onError(showNotice);
const chat = new Chat(store, showNotice);
const conversations = new ConversationList(store, showNotice);
const dashboard = new Dashboard();

function showView(name) {
  $("#chat-view").hidden = name !== "chat";
  $("#dash-view").hidden = name !== "dashboard";
  $("#show-chat").classList.toggle("active", name === "chat");
  $("#show-dashboard").classList.toggle("active", name === "dashboard");
  if (name === "dashboard") dashboard.start();
  else dashboard.stop();
}

// --- the API key ------------------------------------------------------------------------
const dialog = $("#key-dialog");

function askForKey(message) {
  $("#key-error").textContent = message || "";
  $("#key-input").value = "";
  if (!dialog.open) dialog.showModal();
}

onKeyRefused((error) => askForKey(apiKey() ? error.message : "this server needs an API key"));

$("#key-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  setApiKey($("#key-input").value.trim());
  dialog.close();
  await connect();
  if (!$("#dash-view").hidden) {
    dashboard.stop();
    dashboard.start();
  }
});
$("#key-cancel").addEventListener("click", () => dialog.close());
$("#change-key").addEventListener("click", () => askForKey(""));
$("#forget-key").addEventListener("click", () => {
  setApiKey("");
  askForKey("");
});

async function connect() {
  try {
    await chat.loadModels();
    showNotice("");
  } catch (error) {
    if (error.status !== 401) showNotice(`cannot reach the server: ${error.message}`);
  }
}

// --- start ------------------------------------------------------------------------------
$("#show-chat").addEventListener("click", () => showView("chat"));
$("#show-dashboard").addEventListener("click", () => showView("dashboard"));
if (!store.get(store.currentId())) {
  const newest = store.list()[0];
  if (newest) store.setCurrent(newest.id);
  else store.create();
}
conversations.render();
chat.render();
showView("chat");
connect();
document.body.dataset.ready = "true";
