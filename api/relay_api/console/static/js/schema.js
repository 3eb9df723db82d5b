// The recipe's fields as the API describes them in its OpenAPI document (SFTConfig), so the form
// and the config view follow the API without a second list here.

let cached = null;

export async function recipeSchema() {
  if (!cached) {
    cached = fetch("/openapi.json")
      .then((answer) => answer.json())
      .then((doc) => {
        const schema = doc.components.schemas.SFTConfig;
        return {
          fields: Object.keys(schema.properties),
          properties: schema.properties,
          required: schema.required || [],
          rules: schema.allOf || [], // the rules across fields: which models take which fields
        };
      })
      .catch((error) => {
        cached = null;
        throw error;
      });
  }
  return cached;
}
