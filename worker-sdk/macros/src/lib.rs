//! The `#[tool]` attribute of `worker-sdk`; use it as `worker_sdk::tool`.
//!
//! It keeps the function as written and adds a `<name>_tool()` constructor that returns a
//! `worker_sdk::Tool`: the parameters after the context become a hidden arguments struct whose
//! JSON Schema (schemars) is the tool's input schema and whose decoding (serde) feeds the call.

mod agent;

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Attribute, Expr, ExprArray, ExprLit, FnArg, ItemFn, Lit, LitStr, Pat, ReturnType, Type, parse_macro_input};

const OPTIONS: &str = "name, description, timeout, retry, idempotency, read_only, writes, strip_nulls, version, owner, \
                       risk, permissions, resources, secret, cost_per_call, cache_ttl, requires_approval, \
                       approval_timeout, per_second, burst, at_once";

/// Turns a function into a tool: keeps the function and adds `<name>_tool() -> worker_sdk::Tool`.
///
/// ```ignore
/// /// Issue a refund to a customer. Amounts are in cents.
/// #[tool(version = "3", owner = "payments", risk = "high", permissions = ["billing:write"],
///        timeout = 10, idempotency = "at_most_once", requires_approval = "args.cents > 10000")]
/// async fn refund(ctx: ToolContext, customer_id: String, cents: i64) -> Result<String, ToolError> {
///     payments::refund(&customer_id, cents, ctx.idempotency_key()).await
/// }
/// ```
///
/// The first parameter may be the `ToolContext` (by value or by reference); the others are
/// the arguments the model fills in, described by their doc comments. The description is the
/// first paragraph of the function's doc comment. A non-async function runs on a blocking thread.
///
/// A function that returns a stream (`fn ... -> impl Stream<Item = Result<T, ToolError>>`, not
/// `async`, the context by value) is a **streaming tool**: each item but the last is the call's
/// progress (a string is the status line, another value its data), the last is the result.
///
/// The tool id may come first, as a bare string: `#[tool("charge")]`, or
/// `#[tool("charge", idempotency = "at_most_once")]`; `#[tool]` and `#[tool()]` take the
/// function's name. A tool with neither a doc comment nor `description` does not compile: the
/// model would see no description.
///
/// Options: `name = "..."`, `description = "..."`, `timeout = <seconds>`, `retry = <retries>`,
/// `idempotency = "safe_to_retry" | "at_most_once"`, `read_only`, `writes`, `version = "..."`,
/// `owner = "..."`, `risk = "low" | "medium" | "high" | "critical"`, `permissions = [...]`,
/// `resources = [...]`, `secret = [...]` (fields kept out of the kernel's record: `Tool::secret`),
/// `cost_per_call = <number>`, `cache_ttl = <seconds>`,
/// `requires_approval = true | "<CEL predicate over args>"`, `approval_timeout = <seconds>`,
/// `per_second = <number>`, `burst = <calls>`, `at_once = <calls>` (the tool's own limit, which
/// the kernel holds across every worker: `Tool::per_second`, `Tool::burst`, `Tool::at_once`).
#[proc_macro_attribute]
pub fn tool(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut options = Options::default();
    let parser = |input: syn::parse::ParseStream<'_>| options.parse_all(input);
    parse_macro_input!(attr with parser);
    let function = parse_macro_input!(item as ItemFn);
    match expand(options, function) {
        Ok(tokens) => tokens.into(),
        Err(error) => error.to_compile_error().into(),
    }
}

/// Turns an async function into a hosted agent's handler: keeps the function and adds
/// `<name>_agent() -> worker_sdk::Agent`.
///
/// ```ignore
/// /// Looks a question up and summarizes what it found.
/// #[agent(version = "2", max_concurrency = 4)]
/// async fn researcher(ctx: AgentContext, question: Question) -> Result<Answer, AgentError> {
///     let found = ctx.call(Call::new("search", json!({"q": question.text}))).await?;
///     Ok(Answer { text: found.content })
/// }
/// ```
///
/// The handler takes the `AgentContext` and the run's input (its type's JSON Schema is the
/// agent's input schema) and returns `Result<Output, AgentError>`. The description is the first
/// paragraph of the doc comment; an agent with neither a doc comment nor `description` does not
/// compile. Options: `name = "..."` (default: the function's name), `description = "..."`,
/// `version = "..."`, `max_concurrency = <runs one worker hosts at once>`.
#[proc_macro_attribute]
pub fn agent(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut options = agent::Options::default();
    let parser = syn::meta::parser(|meta| options.parse(meta));
    parse_macro_input!(attr with parser);
    let function = parse_macro_input!(item as ItemFn);
    match agent::expand(options, function) {
        Ok(tokens) => tokens.into(),
        Err(error) => error.to_compile_error().into(),
    }
}

/// The attribute's options, as parsed.
#[derive(Default)]
struct Options {
    name: Option<LitStr>,
    description: Option<LitStr>,
    timeout: Option<u64>,
    retry: Option<u32>,
    idempotency: Option<TokenStream2>,
    read_only: Option<Span>,
    strip_nulls: bool,
    writes: Option<Span>,
    version: Option<String>,
    owner: Option<String>,
    risk: Option<TokenStream2>,
    permissions: Option<Vec<String>>,
    resources: Option<Vec<String>>,
    secret: Option<Vec<String>>,
    cost_per_call: Option<f64>,
    cache_ttl: Option<u64>,
    cache_ttl_span: Option<Span>,
    requires_approval: Option<TokenStream2>,
    approval_timeout: Option<u64>,
    per_second: Option<f64>,
    burst: Option<u32>,
    at_once: Option<u32>,
    seen: Vec<String>,
}

impl Options {
    /// Parses the attribute's arguments: an optional tool id first, as a bare string
    /// (`#[tool("charge")]`, `#[tool("charge", idempotency = "at_most_once")]`), then options.
    fn parse_all(&mut self, input: syn::parse::ParseStream<'_>) -> syn::Result<()> {
        if input.peek(LitStr) {
            let name: LitStr = input.parse()?;
            self.set_name(name)?;
            if input.is_empty() {
                return Ok(());
            }
            input.parse::<syn::Token![,]>()?;
        }
        let rest: TokenStream2 = input.parse()?;
        syn::parse::Parser::parse2(syn::meta::parser(|meta| self.parse(meta)), rest)
    }

    fn set_name(&mut self, name: LitStr) -> syn::Result<()> {
        if self.name.is_some() {
            return Err(syn::Error::new(name.span(), "the tool id is given twice"));
        }
        if !valid_tool_name(&name.value()) {
            return Err(syn::Error::new(
                name.span(),
                "a tool name is 1 to 64 characters from [a-zA-Z0-9_-]",
            ));
        }
        self.name = Some(name);
        Ok(())
    }

    fn parse(&mut self, meta: syn::meta::ParseNestedMeta<'_>) -> syn::Result<()> {
        let key = meta.path.get_ident().map(|ident| ident.to_string()).unwrap_or_default();
        if self.seen.contains(&key) {
            return Err(meta.error(format!("option `{key}` is given twice")));
        }
        match key.as_str() {
            "name" => self.set_name(meta.value()?.parse()?)?,
            "description" => self.description = Some(meta.value()?.parse()?),
            "timeout" => self.timeout = Some(seconds_as_millis(&meta.value()?.parse()?)?),
            "cache_ttl" => {
                self.cache_ttl_span = Some(meta.path.span());
                self.cache_ttl = Some(seconds_as_millis(&meta.value()?.parse()?)?);
            }
            "approval_timeout" => self.approval_timeout = Some(seconds_as_millis(&meta.value()?.parse()?)?),
            "retry" => {
                let lit: syn::LitInt = meta.value()?.parse()?;
                self.retry = Some(lit.base10_parse()?);
            }
            "idempotency" => {
                let lit: LitStr = meta.value()?.parse()?;
                self.idempotency = Some(match lit.value().as_str() {
                    "safe_to_retry" => quote!(::worker_sdk::Idempotency::SafeToRetry),
                    "at_most_once" => quote!(::worker_sdk::Idempotency::AtMostOnce),
                    _ => {
                        return Err(syn::Error::new(
                            lit.span(),
                            "idempotency is \"safe_to_retry\" or \"at_most_once\"",
                        ));
                    }
                });
            }
            "risk" => {
                let lit: LitStr = meta.value()?.parse()?;
                self.risk = Some(match lit.value().as_str() {
                    "low" => quote!(::worker_sdk::RiskLevel::Low),
                    "medium" => quote!(::worker_sdk::RiskLevel::Medium),
                    "high" => quote!(::worker_sdk::RiskLevel::High),
                    "critical" => quote!(::worker_sdk::RiskLevel::Critical),
                    _ => {
                        return Err(syn::Error::new(
                            lit.span(),
                            "risk is \"low\", \"medium\", \"high\" or \"critical\"",
                        ));
                    }
                });
            }
            "strip_nulls" => self.strip_nulls = true,
            "read_only" | "writes" => {
                let span = meta.path.span();
                let on = if meta.input.peek(syn::Token![=]) {
                    let lit: syn::LitBool = meta.value()?.parse()?;
                    lit.value
                } else {
                    true
                };
                let (this, other, other_name) = if key == "read_only" {
                    (&mut self.read_only, self.writes, "writes")
                } else {
                    (&mut self.writes, self.read_only, "read_only")
                };
                if on {
                    if other.is_some() {
                        return Err(syn::Error::new(
                            span,
                            format!("a tool cannot be both `read_only` and `writes`: drop `{key}` or `{other_name}`"),
                        ));
                    }
                    *this = Some(span);
                }
            }
            "version" => {
                self.version = Some(match meta.value()?.parse::<Lit>()? {
                    Lit::Str(lit) => lit.value(),
                    Lit::Int(lit) => lit.base10_digits().to_owned(),
                    other => return Err(syn::Error::new(other.span(), "version is a string, e.g. \"3\"")),
                });
            }
            "owner" => self.owner = Some(meta.value()?.parse::<LitStr>()?.value()),
            "permissions" => self.permissions = Some(string_list(&meta.value()?.parse()?)?),
            "resources" => self.resources = Some(string_list(&meta.value()?.parse()?)?),
            "secret" => self.secret = Some(string_list(&meta.value()?.parse()?)?),
            "cost_per_call" => self.cost_per_call = Some(number(&meta.value()?.parse()?)?),
            "per_second" => self.per_second = Some(number(&meta.value()?.parse()?)?),
            "burst" => self.burst = Some(meta.value()?.parse::<syn::LitInt>()?.base10_parse()?),
            "at_once" => self.at_once = Some(meta.value()?.parse::<syn::LitInt>()?.base10_parse()?),
            "requires_approval" => {
                self.requires_approval = Some(match meta.value()?.parse::<Lit>()? {
                    Lit::Bool(lit) => {
                        let on = lit.value;
                        quote!(.requires_approval(#on))
                    }
                    Lit::Str(lit) if !lit.value().trim().is_empty() => quote!(.requires_approval_if(#lit)),
                    other => {
                        return Err(syn::Error::new(
                            other.span(),
                            "requires_approval is true, false, or a CEL predicate such as \"args.cents > 10000\"",
                        ));
                    }
                });
            }
            _ => {
                let shown = if key.is_empty() {
                    quote::ToTokens::to_token_stream(&meta.path).to_string()
                } else {
                    key
                };
                return Err(meta.error(format!("unknown #[tool] option `{shown}`; expected one of: {OPTIONS}")));
            }
        }
        self.seen.push(key);
        Ok(())
    }

    /// Refuses options that make no sense together, as the kernel would at registration.
    fn check(&self) -> syn::Result<()> {
        if let (Some(span), None) = (self.cache_ttl_span, self.read_only) {
            return Err(syn::Error::new(
                span,
                "`cache_ttl` needs `read_only`: only a tool without side effects may have its results served \
                 again from the cache; add `read_only` or drop `cache_ttl`",
            ));
        }
        Ok(())
    }

    /// The builder calls that apply the options to a `Tool`.
    fn setters(&self) -> TokenStream2 {
        let mut out = TokenStream2::new();
        let duration = |millis: u64| quote!(::std::time::Duration::from_millis(#millis));
        if let Some(millis) = self.timeout {
            let d = duration(millis);
            out.extend(quote!(.timeout(#d)));
        }
        if let Some(retries) = self.retry {
            out.extend(quote!(.retry(#retries)));
        }
        if let Some(idempotency) = &self.idempotency {
            out.extend(quote!(.idempotency(#idempotency)));
        }
        if self.read_only.is_some() {
            out.extend(quote!(.read_only()));
        }
        if self.strip_nulls {
            out.extend(quote!(.strip_nulls()));
        }
        if self.writes.is_some() {
            out.extend(quote!(.writes()));
        }
        if let Some(version) = &self.version {
            out.extend(quote!(.version(#version)));
        }
        if let Some(owner) = &self.owner {
            out.extend(quote!(.owner(#owner)));
        }
        if let Some(risk) = &self.risk {
            out.extend(quote!(.risk(#risk)));
        }
        if let Some(permissions) = &self.permissions {
            out.extend(quote!(.permissions(<[&str]>::to_vec(&[#(#permissions),*]))));
        }
        if let Some(resources) = &self.resources {
            out.extend(quote!(.resources(<[&str]>::to_vec(&[#(#resources),*]))));
        }
        if let Some(secret) = &self.secret {
            out.extend(quote!(.secret(<[&str]>::to_vec(&[#(#secret),*]))));
        }
        if let Some(cost) = self.cost_per_call {
            out.extend(quote!(.cost_per_call(#cost)));
        }
        if let Some(millis) = self.cache_ttl {
            let d = duration(millis);
            out.extend(quote!(.cache_ttl(#d)));
        }
        if let Some(approval) = &self.requires_approval {
            out.extend(approval.clone());
        }
        if let Some(millis) = self.approval_timeout {
            let d = duration(millis);
            out.extend(quote!(.approval_timeout(#d)));
        }
        if let Some(rate) = self.per_second {
            out.extend(quote!(.per_second(#rate)));
        }
        if let Some(burst) = self.burst {
            out.extend(quote!(.burst(#burst)));
        }
        if let Some(calls) = self.at_once {
            out.extend(quote!(.at_once(#calls)));
        }
        out
    }
}

fn valid_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn number(lit: &Lit) -> syn::Result<f64> {
    match lit {
        Lit::Int(int) => int.base10_parse::<f64>(),
        Lit::Float(float) => float.base10_parse::<f64>(),
        other => Err(syn::Error::new(other.span(), "expected a number")),
    }
}

fn seconds_as_millis(lit: &Lit) -> syn::Result<u64> {
    let seconds = number(lit).map_err(|_| syn::Error::new(lit.span(), "expected seconds, e.g. 10 or 2.5"))?;
    if !seconds.is_finite() || seconds < 0.0 {
        return Err(syn::Error::new(lit.span(), "expected a non-negative number of seconds"));
    }
    Ok((seconds * 1000.0).round() as u64)
}

fn string_list(expr: &Expr) -> syn::Result<Vec<String>> {
    let string = |expr: &Expr| match expr {
        Expr::Lit(ExprLit { lit: Lit::Str(lit), .. }) => Ok(lit.value()),
        other => Err(syn::Error::new(other.span(), "expected a string")),
    };
    match expr {
        Expr::Array(ExprArray { elems, .. }) => elems.iter().map(string).collect(),
        single => Ok(vec![string(single)?]),
    }
}

/// The text of the `#[doc]` attributes, one entry per line.
fn doc_lines(attrs: &[Attribute]) -> Vec<String> {
    attrs
        .iter()
        .filter(|attr| attr.path().is_ident("doc"))
        .filter_map(|attr| match &attr.meta {
            syn::Meta::NameValue(nv) => match &nv.value {
                Expr::Lit(ExprLit { lit: Lit::Str(lit), .. }) => Some(lit.value()),
                _ => None,
            },
            _ => None,
        })
        .flat_map(|text| text.split('\n').map(|line| line.trim().to_owned()).collect::<Vec<_>>())
        .collect()
}

/// The first paragraph of a doc comment, its lines joined: what rustdoc also shows as the summary.
fn summary(attrs: &[Attribute]) -> String {
    doc_lines(attrs)
        .into_iter()
        .skip_while(|line| line.is_empty())
        .take_while(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The last path segment of a type, seen through one reference.
fn type_name(ty: &Type) -> Option<String> {
    match ty {
        Type::Path(path) => path.path.segments.last().map(|segment| segment.ident.to_string()),
        Type::Reference(reference) => type_name(&reference.elem),
        _ => None,
    }
}

/// Whether the function returns a stream (`impl Stream<...>` or a `BoxStream`): a streaming tool.
fn returns_stream(output: &ReturnType) -> bool {
    let ReturnType::Type(_, ty) = output else {
        return false;
    };
    match &**ty {
        Type::ImplTrait(bounds) => bounds.bounds.iter().any(|bound| {
            matches!(bound, syn::TypeParamBound::Trait(t)
                if t.path.segments.last().is_some_and(|segment| segment.ident == "Stream"))
        }),
        other => type_name(other).is_some_and(|name| name == "BoxStream"),
    }
}

/// One model-facing argument of the function.
struct Argument {
    ident: syn::Ident,
    ty: Type,
    /// `doc`, `serde` and `schemars` attributes, moved onto the arguments struct's field.
    attrs: Vec<Attribute>,
}

fn expand(options: Options, mut function: ItemFn) -> syn::Result<TokenStream2> {
    options.check()?;
    let sig = &function.sig;
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        return Err(syn::Error::new(
            sig.generics.span(),
            "#[tool] functions cannot be generic",
        ));
    }
    if let ReturnType::Default = sig.output {
        return Err(syn::Error::new(
            sig.span(),
            "a #[tool] function returns Result<T, ToolError> where T: Serialize",
        ));
    }
    let is_async = sig.asyncness.is_some();
    let fn_ident = sig.ident.clone();
    let fn_name = fn_ident.to_string().trim_start_matches("r#").to_owned();

    // Split the context parameter from the arguments, and strip the attributes Rust does not
    // allow on parameters (doc comments) or that belong to the arguments struct.
    let mut context: Option<bool> = None; // Some(by_reference)
    let mut arguments = Vec::new();
    for (index, input) in function.sig.inputs.iter_mut().enumerate() {
        let FnArg::Typed(typed) = input else {
            return Err(syn::Error::new(
                input.span(),
                "#[tool] goes on a free function, not a method",
            ));
        };
        if index == 0 && type_name(&typed.ty).as_deref() == Some("ToolContext") {
            context = Some(matches!(*typed.ty, Type::Reference(_)));
            continue;
        }
        let Pat::Ident(pat) = &*typed.pat else {
            return Err(syn::Error::new(
                typed.pat.span(),
                "a tool argument needs a plain name, e.g. `city: String`",
            ));
        };
        if matches!(*typed.ty, Type::Reference(_) | Type::ImplTrait(_)) {
            return Err(syn::Error::new(
                typed.ty.span(),
                "a tool argument is an owned type decoded from JSON, e.g. `String` rather than `&str`",
            ));
        }
        let (moved, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut typed.attrs).into_iter().partition(|attr| {
            attr.path().is_ident("doc") || attr.path().is_ident("serde") || attr.path().is_ident("schemars")
        });
        typed.attrs = kept;
        let ident = syn::Ident::new(pat.ident.to_string().trim_start_matches("r#"), pat.ident.span());
        arguments.push(Argument {
            ident,
            ty: (*typed.ty).clone(),
            attrs: moved,
        });
    }

    let name = options
        .name
        .as_ref()
        .map(LitStr::value)
        .unwrap_or_else(|| fn_name.clone());
    if !valid_tool_name(&name) {
        return Err(syn::Error::new(
            fn_ident.span(),
            "a tool name is 1 to 64 characters from [a-zA-Z0-9_-]",
        ));
    }
    let description = options
        .description
        .as_ref()
        .map(LitStr::value)
        .unwrap_or_else(|| summary(&function.attrs));
    if description.trim().is_empty() {
        return Err(syn::Error::new(
            fn_ident.span(),
            "the model would see no description of this tool: add a doc comment or `description = \"...\"`",
        ));
    }

    let vis = &function.vis;
    let builder_ident = format_ident!("{}_tool", fn_name);
    let field_idents: Vec<_> = arguments.iter().map(|arg| &arg.ident).collect();
    let fields = arguments
        .iter()
        .map(|Argument { ident, ty, attrs }| quote!(#(#attrs)* #ident: #ty));
    // A field renamed or defaulted through serde is checked by serde alone.
    let checks = arguments
        .iter()
        .filter(|arg| !arg.attrs.iter().any(|attr| attr.path().is_ident("serde")))
        .map(|Argument { ident, ty, .. }| {
            let key = ident.to_string();
            quote_spanned!(ty.span()=> ::worker_sdk::__private::FieldCheck {
                name: #key,
                check: ::worker_sdk::__private::check_field::<#ty>,
            })
        });
    let ctx_arg = match context {
        Some(true) => quote!(&__ctx,),
        Some(false) => quote!(__ctx,),
        None => quote!(),
    };
    let call = quote!(#fn_ident(#ctx_arg #(#field_idents),*));
    let streams = returns_stream(&function.sig.output);
    if streams && is_async {
        return Err(syn::Error::new(
            function.sig.asyncness.span(),
            "a streaming #[tool] is a plain `fn` returning `impl Stream`: do the async work inside the stream",
        ));
    }
    if streams && context == Some(true) {
        return Err(syn::Error::new(
            function.sig.inputs.span(),
            "a streaming #[tool] takes its ToolContext by value: the stream outlives the call of the function",
        ));
    }
    let constructor = if streams {
        quote! {
            ::worker_sdk::__private::stream_tool::<__Args, _, _, _, _>(#name, #description, __FIELDS,
                |__ctx: ::worker_sdk::ToolContext, __args: __Args| {
                    let __Args { #(#field_idents),* } = __args;
                    #call
                })
        }
    } else if is_async {
        quote! {
            ::worker_sdk::__private::async_tool::<__Args, _, _, _, _>(#name, #description, __FIELDS,
                |__ctx: ::worker_sdk::ToolContext, __args: __Args| async move {
                    let __Args { #(#field_idents),* } = __args;
                    #call.await
                })
        }
    } else {
        quote! {
            ::worker_sdk::__private::blocking_tool::<__Args, _, _, _>(#name, #description, __FIELDS,
                |__ctx: ::worker_sdk::ToolContext, __args: __Args| {
                    let __Args { #(#field_idents),* } = __args;
                    #call
                })
        }
    };
    let setters = options.setters();
    let builder_doc = format!("The `{name}` tool, served by [`{fn_name}`].");

    Ok(quote! {
        #function

        #[doc = #builder_doc]
        #vis fn #builder_ident() -> ::worker_sdk::Tool {
            #[derive(::worker_sdk::__private::serde::Deserialize, ::worker_sdk::__private::schemars::JsonSchema)]
            #[serde(crate = "::worker_sdk::__private::serde", deny_unknown_fields)]
            #[schemars(crate = "::worker_sdk::__private::schemars")]
            struct __Args {
                #(#fields,)*
            }
            const __FIELDS: &[::worker_sdk::__private::FieldCheck] = &[#(#checks),*];
            #constructor #setters
        }
    })
}

#[cfg(test)]
mod tests {

    use super::*;

    fn parse_options(tokens: TokenStream2) -> syn::Result<Options> {
        let mut options = Options::default();
        syn::parse::Parser::parse2(|input: syn::parse::ParseStream<'_>| options.parse_all(input), tokens)?;
        Ok(options)
    }

    #[test]
    fn the_tool_id_may_come_first_and_only_once() {
        let options = parse_options(quote!("charge", idempotency = "at_most_once")).unwrap();
        assert_eq!(options.name.unwrap().value(), "charge");
        assert!(parse_options(quote!("charge")).is_ok());
        assert!(parse_options(quote!()).is_ok());
        assert!(error(quote!("charge", name = "bill")).contains("the tool id is given twice"));
        assert!(error(quote!("no spaces")).contains("1 to 64 characters"));
    }

    #[test]
    fn a_tool_without_a_description_is_refused() {
        let undocumented = quote!(
            async fn f(ctx: ToolContext) -> Result<(), ToolError> {
                Ok(())
            }
        );
        let refused = expand_error(quote!(), undocumented);
        assert!(refused.contains("the model would see no description"), "{refused}");
    }

    #[test]
    fn a_streaming_tool_is_a_plain_fn_taking_its_context_by_value() {
        let asynchronous = quote!(
            /// Streams.
            async fn f(ctx: ToolContext) -> impl Stream<Item = Result<String, ToolError>> {
                stream::empty()
            }
        );
        assert!(expand_error(quote!(), asynchronous).contains("a plain `fn` returning `impl Stream`"));
        let borrowed = quote!(
            /// Streams.
            fn f(ctx: &ToolContext) -> BoxStream<'static, Result<String, ToolError>> {
                stream::empty().boxed()
            }
        );
        assert!(expand_error(quote!(), borrowed).contains("takes its ToolContext by value"));
        let streaming = quote!(
            /// Streams.
            fn f(ctx: ToolContext) -> impl futures::Stream<Item = Result<String, ToolError>> {
                stream::empty()
            }
        );
        let expanded = expand(parse_options(quote!()).unwrap(), syn::parse2(streaming).unwrap())
            .unwrap()
            .to_string();
        assert!(expanded.contains("stream_tool"), "{expanded}");
    }

    fn error(tokens: TokenStream2) -> String {
        match parse_options(tokens) {
            Ok(_) => panic!("options parsed"),
            Err(error) => error.to_string(),
        }
    }

    fn expand_error(attr: TokenStream2, function: TokenStream2) -> String {
        let options = parse_options(attr).unwrap();
        match expand(options, syn::parse2(function).unwrap()) {
            Ok(_) => panic!("expanded"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn read_only_with_writes_is_refused_either_way() {
        let expected = "a tool cannot be both `read_only` and `writes`";
        assert!(error(quote!(read_only, writes)).starts_with(expected));
        assert!(error(quote!(writes, timeout = 3, read_only)).starts_with(expected));
        assert!(parse_options(quote!(read_only = false, writes)).is_ok());
    }

    #[test]
    fn unknown_options_are_named() {
        let message = error(quote!(timeout = 3, retries = 2));
        assert!(
            message.starts_with("unknown #[tool] option `retries`; expected one of: name,"),
            "{message}"
        );
    }

    #[test]
    fn option_values_are_checked() {
        assert!(error(quote!(idempotency = "once")).contains("at_most_once"));
        assert!(error(quote!(risk = "extreme")).contains("critical"));
        assert!(error(quote!(name = "has space")).contains("[a-zA-Z0-9_-]"));
        assert!(error(quote!(timeout = "ten")).contains("seconds"));
        assert!(error(quote!(requires_approval = "")).contains("CEL predicate"));
        assert!(error(quote!(permissions = [1])).contains("expected a string"));
        assert!(error(quote!(retry = 1, retry = 2)).contains("given twice"));
    }

    #[test]
    fn option_values_are_read() {
        let options = parse_options(quote!(
            timeout = 2.5,
            cache_ttl = 300,
            retry = 3,
            version = 3,
            permissions = ["a:b", "c"],
            resources = "workspace",
            cost_per_call = 1,
            requires_approval = true,
            per_second = 2.5,
            burst = 5,
            at_once = 4
        ))
        .unwrap();
        assert_eq!(options.timeout, Some(2500));
        assert_eq!(options.cache_ttl, Some(300_000));
        assert_eq!(options.retry, Some(3));
        assert_eq!(options.version.as_deref(), Some("3"));
        assert_eq!(options.permissions, Some(vec!["a:b".to_owned(), "c".to_owned()]));
        assert_eq!(options.resources, Some(vec!["workspace".to_owned()]));
        assert_eq!(options.cost_per_call, Some(1.0));
        assert_eq!(
            (options.per_second, options.burst, options.at_once),
            (Some(2.5), Some(5), Some(4))
        );
    }

    #[test]
    fn function_shapes_are_checked() {
        let async_fn = quote!(
            async fn f<T>(x: T) -> Result<(), ToolError> {
                Ok(())
            }
        );
        assert!(expand_error(quote!(), async_fn).contains("generic"));
        let method = quote!(
            async fn f(&self) -> Result<(), ToolError> {
                Ok(())
            }
        );
        assert!(expand_error(quote!(), method).contains("free function"));
        let borrowed = quote!(
            async fn f(ctx: ToolContext, s: &str) -> Result<(), ToolError> {
                Ok(())
            }
        );
        assert!(expand_error(quote!(), borrowed).contains("owned type"));
        let no_result = quote!(
            async fn f(ctx: ToolContext) {}
        );
        assert!(expand_error(quote!(), no_result).contains("returns Result"));
    }

    #[test]
    fn a_cache_ttl_needs_read_only() {
        let function = || {
            quote!(
                /// Does f.
                async fn f(ctx: ToolContext) -> Result<(), ToolError> {
                    Ok(())
                }
            )
        };
        let refused = expand_error(quote!(cache_ttl = 60), function());
        assert!(refused.contains("`cache_ttl` needs `read_only`"), "{refused}");
        let writes = expand_error(quote!(writes, cache_ttl = 60), function());
        assert!(writes.contains("needs `read_only`"), "{writes}");
        let options = parse_options(quote!(read_only, cache_ttl = 60)).unwrap();
        assert!(expand(options, syn::parse2(function()).unwrap()).is_ok());
    }

    #[test]
    fn description_is_the_first_paragraph() {
        let function: ItemFn = syn::parse2(quote! {
            #[doc = " First line"]
            #[doc = " continues here."]
            #[doc = ""]
            #[doc = " Details."]
            fn f() {}
        })
        .unwrap();
        assert_eq!(summary(&function.attrs), "First line continues here.");
    }
}
