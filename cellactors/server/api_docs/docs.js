// The /docs page of a cellactors node: Swagger UI (vendored, served by the node itself)
// rendering the node's own /openapi.json. Nothing is fetched from any other origin: no
// validator badge, no fonts, no remote document.
"use strict";

window.addEventListener("DOMContentLoaded", function () {
  // Relative: the page is /docs, so this is the same node's /openapi.json (also behind a
  // proxy that serves the node under a path prefix).
  const url = new URL("openapi.json", document.baseURI).href;
  window.ui = SwaggerUIBundle({
    url: url,
    dom_id: "#api",
    deepLinking: true,
    validatorUrl: null, // the default sends the document to a public validator
    queryConfigEnabled: false, // no ?url= to render another document on this origin
    persistAuthorization: false, // a token pasted in "Authorize" stays in this tab's memory
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
  });
});
