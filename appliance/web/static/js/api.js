// The page's calls to its own server: the API key (sessionStorage, sent as a Bearer header,
// never in a URL) and the OpenAI error envelope as an ApiError.

const KEY_STORAGE = "appliance.apiKey";
const keyListeners = [];

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function apiKey() {
  return sessionStorage.getItem(KEY_STORAGE) || "";
}

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY_STORAGE, key);
  else sessionStorage.removeItem(KEY_STORAGE);
}

/** `listener(error)` runs when the server refuses the key (401). */
export function onKeyRefused(listener) {
  keyListeners.push(listener);
}

/** fetch with the key; a non-2xx answer raises ApiError with the server's message. */
export async function apiFetch(path, { body, signal, method } = {}) {
  const headers = {};
  const key = apiKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method: method || (body === undefined ? "GET" : "POST"),
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
    cache: "no-store",
  });
  if (!response.ok) {
    const error = new ApiError(response.status, await errorMessage(response));
    if (response.status === 401) keyListeners.forEach((listener) => listener(error));
    throw error;
  }
  return response;
}

export async function getJSON(path, options) {
  return (await apiFetch(path, options)).json();
}

async function errorMessage(response) {
  try {
    const doc = await response.json();
    return String(doc?.error?.message ?? `HTTP ${response.status}`);
  } catch {
    return `HTTP ${response.status}`;
  }
}
