//! The `#[agent]` attribute: keeps an agent's handler as written and adds `<name>_agent()`, which
//! returns the `worker_sdk::Agent` a worker hosts.

use proc_macro2::TokenStream as TokenStream2;
use quote::{format_ident, quote};
use syn::spanned::Spanned;
use syn::{FnArg, ItemFn, LitInt, LitStr, ReturnType};

use super::{summary, valid_tool_name};

pub(crate) const OPTIONS: &str = "name, description, version, max_concurrency";

/// The attribute's options, as parsed.
#[derive(Default)]
pub(crate) struct Options {
    name: Option<LitStr>,
    description: Option<LitStr>,
    version: Option<LitStr>,
    max_concurrency: Option<u32>,
}

impl Options {
    pub(crate) fn parse(&mut self, meta: syn::meta::ParseNestedMeta<'_>) -> syn::Result<()> {
        let key = meta.path.get_ident().map(|ident| ident.to_string()).unwrap_or_default();
        let twice = || meta.error(format!("option `{key}` is given twice"));
        match key.as_str() {
            "name" => {
                if self.name.is_some() {
                    return Err(twice());
                }
                let name: LitStr = meta.value()?.parse()?;
                if !valid_tool_name(&name.value()) {
                    return Err(syn::Error::new(
                        name.span(),
                        "an agent name is 1 to 64 of a-z, A-Z, 0-9, _ and -",
                    ));
                }
                self.name = Some(name);
            }
            "description" => {
                if self.description.is_some() {
                    return Err(twice());
                }
                self.description = Some(meta.value()?.parse()?);
            }
            "version" => {
                if self.version.is_some() {
                    return Err(twice());
                }
                self.version = Some(meta.value()?.parse()?);
            }
            "max_concurrency" => {
                if self.max_concurrency.is_some() {
                    return Err(twice());
                }
                let max: LitInt = meta.value()?.parse()?;
                self.max_concurrency = Some(max.base10_parse()?);
            }
            _ => {
                return Err(meta.error(format!("unknown #[agent] option `{key}`; expected one of: {OPTIONS}")));
            }
        }
        Ok(())
    }
}

pub(crate) fn expand(options: Options, function: ItemFn) -> syn::Result<TokenStream2> {
    let sig = &function.sig;
    if sig.asyncness.is_none() {
        return Err(syn::Error::new(
            sig.fn_token.span(),
            "an #[agent] handler is an async fn(AgentContext, Input) -> Result<Output, AgentError>",
        ));
    }
    if !sig.generics.params.is_empty() {
        return Err(syn::Error::new(
            sig.generics.span(),
            "#[agent] handlers cannot be generic",
        ));
    }
    if sig.inputs.len() != 2 || sig.inputs.iter().any(|input| matches!(input, FnArg::Receiver(_))) {
        return Err(syn::Error::new(
            sig.inputs.span(),
            "an #[agent] handler takes two parameters: the AgentContext and the run's input",
        ));
    }
    if let ReturnType::Default = sig.output {
        return Err(syn::Error::new(
            sig.span(),
            "an #[agent] handler returns Result<Output, AgentError> where Output: Serialize",
        ));
    }
    let fn_ident = sig.ident.clone();
    let fn_name = fn_ident.to_string().trim_start_matches("r#").to_owned();
    let name = options.name.map(|n| n.value()).unwrap_or_else(|| fn_name.clone());
    let description = match options.description {
        Some(description) => description.value(),
        None => summary(&function.attrs),
    };
    if description.trim().is_empty() {
        return Err(syn::Error::new(
            sig.ident.span(),
            "the agent has no description: add a doc comment or `description = \"...\"`",
        ));
    }
    let constructor = format_ident!("{}_agent", fn_name);
    let version = options.version.map(|v| quote! { .version(#v) }).unwrap_or_default();
    let max = options
        .max_concurrency
        .map(|m| quote! { .max_concurrency(#m) })
        .unwrap_or_default();
    let vis = &function.vis;
    let doc = format!("The agent `{name}`, hosted by a worker that offers it (made by `#[agent]` from [`{fn_name}`]).");
    Ok(quote! {
        #function

        #[doc = #doc]
        #vis fn #constructor() -> ::worker_sdk::Agent {
            ::worker_sdk::Agent::new(#name, #description, #fn_ident) #version #max
        }
    })
}
