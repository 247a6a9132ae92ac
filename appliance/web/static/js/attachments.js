// Images attached to the next message: picked from a file, read as data URLs, shown as
// thumbnails until sent. Shown only for a model whose /v1/models entry lists "image" in its
// input_modalities. A message's images travel as OpenAI image_url content parts and are kept
// with the conversation in localStorage, hence the size cap.

import { $, fill, h } from "./dom.js";

export const MAX_IMAGE_BYTES = 1024 * 1024;
/** Per image: localStorage holds about 5 MB for the whole page, conversations included. */
const TYPES = new Set(["image/png", "image/jpeg", "image/webp", "image/gif"]);

/** Whether a /v1/models entry takes images. */
export function takesImages(card) {
  return Array.isArray(card?.input_modalities) && card.input_modalities.includes("image");
}

/** A message's content for the API: its text, or text and image_url parts when it has images. */
export function apiContent(message) {
  if (!message.images?.length) return message.content;
  return [
    { type: "text", text: message.content },
    ...message.images.map((url) => ({ type: "image_url", image_url: { url } })),
  ];
}

/** Thumbnails of data URLs (CSP: img-src 'self' data:). */
export function thumbnails(images, onRemove) {
  return (images || []).map((url, i) =>
    h(
      "span",
      { class: "thumb" },
      h("img", { src: url, alt: `image ${i + 1}` }),
      onRemove && h("button", { type: "button", title: "Remove", onclick: () => onRemove(i) }, "✕"),
    ),
  );
}

export class Attachments {
  constructor(showNotice) {
    this.showNotice = showNotice;
    this.images = [];
    this.button = $("#attach");
    this.input = $("#attach-file");
    this.tray = $("#attachments");
    this.button.addEventListener("click", () => this.input.click());
    this.input.addEventListener("change", () => this.add([...this.input.files]));
  }

  /** Show or hide the control for the selected model; hiding drops what is pending. */
  enable(on) {
    this.button.hidden = !on;
    if (!on) this.take();
  }

  async add(files) {
    this.input.value = "";
    for (const file of files) {
      if (!TYPES.has(file.type)) {
        this.showNotice(`${file.name} is not a PNG, JPEG, WebP or GIF image`);
      } else if (file.size > MAX_IMAGE_BYTES) {
        const mib = (file.size / 1024 ** 2).toFixed(1);
        this.showNotice(
          `${file.name} is ${mib} MiB: images up to 1 MiB can be attached ` +
            "(conversations are kept in this browser's storage)",
        );
      } else {
        this.images.push(await dataURL(file));
      }
    }
    this.render();
  }

  /** The pending images, cleared. */
  take() {
    const images = this.images;
    this.images = [];
    this.render();
    return images;
  }

  render() {
    this.tray.hidden = this.images.length === 0;
    fill(
      this.tray,
      thumbnails(this.images, (i) => {
        this.images.splice(i, 1);
        this.render();
      }),
    );
  }
}

function dataURL(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result));
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}
