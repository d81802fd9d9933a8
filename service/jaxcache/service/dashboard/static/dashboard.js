// jaxcache dashboard: small conveniences only. Every page works without this file.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  // The apply button stays disabled until the cache name is typed (the server checks it again).
  for (const form of document.querySelectorAll("form[data-confirm]")) {
    const input = form.querySelector("input[name=confirm]");
    const button = form.querySelector("button[type=submit]");
    const update = () => { button.disabled = input.value.trim() !== form.dataset.confirm; };
    input.addEventListener("input", update);
    update();
  }
  // Copy buttons (hidden without JavaScript).
  for (const button of document.querySelectorAll("button[data-copy]")) {
    if (!navigator.clipboard) continue;
    button.hidden = false;
    button.addEventListener("click", async () => {
      await navigator.clipboard.writeText(button.dataset.copy);
      button.textContent = "Copied";
    });
  }
});
